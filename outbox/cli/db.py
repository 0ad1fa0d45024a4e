"""`outbox db upgrade | downgrade | current`: the framework's own schema migrations; `outbox db
adopt-debezium`: a Debezium-layout outbox table feeding ours (outbox.debezium)."""

from __future__ import annotations

import argparse

import psycopg

from outbox import debezium
from outbox.cli import options
from outbox.core import tables
from outbox.core.config import database_url, schema_name
from outbox.core.postgres import connect, reason
from outbox.errors import error
from outbox.migrations import LOCK_TIMEOUT


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = commands.add_parser("db", help="migrate the framework's tables")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")

    up = options.database(actions.add_parser("upgrade", help="migrate up (default: to head)"))
    up.add_argument("revision", nargs="?", default="head")
    up.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    _lock_timeout(up)
    up.set_defaults(handler=cmd_upgrade)

    down = options.database(actions.add_parser("downgrade", help="migrate down to REV (`base`: drop all)"))
    down.add_argument("revision")
    down.add_argument("--sql", action="store_true", help="print the SQL (REV must be FROM:TO)")
    down.add_argument(
        "--force",
        action="store_true",
        help="drop tables that hold rows too (events not yet published, ledgers, dead letters)",
    )
    _lock_timeout(down)
    down.set_defaults(handler=cmd_downgrade)

    options.database(actions.add_parser("current", help="show the applied revision")).set_defaults(
        handler=cmd_current
    )

    adopt = options.database(
        actions.add_parser(
            "adopt-debezium",
            help="copy each row a Debezium-layout outbox table gets into ours, as the EventRouter maps it",
            description="Put a trigger on TABLE, an outbox table written for Debezium's outbox EventRouter,"
            " that copies each inserted row into outbox_events in the same transaction, mapped as the"
            " router maps it (its defaults, or the options given with --set): the relay, run with"
            f" --event-id-header {debezium.ID_HEADER}, then publishes the records Debezium would."
            " The application changes nothing; rows it deletes in the same transaction are copied too.",
        )
    )
    adopt.add_argument("table", help="the Debezium outbox table")
    adopt.add_argument("--table-schema", help="its schema (default: --schema's)")
    adopt.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an EventRouter option, as in the connector's configuration (its transforms.NAME. prefix"
        f" may stay): {', '.join(debezium.ROUTER_DEFAULTS)}",
    )
    adopt.add_argument("--undo", action="store_true", help="take the trigger away")
    _lock_timeout(adopt)
    adopt.set_defaults(handler=cmd_adopt_debezium)


def _lock_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-timeout",
        type=options.seconds,
        default=LOCK_TIMEOUT,
        metavar="SECONDS",
        help="how long a statement waits for a table's lock, then the run changes nothing"
        f" (default {LOCK_TIMEOUT:g})",
    )


def cmd_upgrade(args: argparse.Namespace) -> int:
    from outbox import migrate  # Alembic, imported by the commands that use it

    url, schema = database_url(args.url), schema_name(args.schema)
    migrate.upgrade(url, schema, args.revision, sql=args.sql, lock_timeout=args.lock_timeout)
    if not args.sql:
        print(f"# {url.safe} schema {schema!r}: at {', '.join(migrate.revisions(url, schema).current)}")
    return 0


def cmd_downgrade(args: argparse.Namespace) -> int:
    from outbox import migrate  # Alembic, imported by the commands that use it

    url, schema = database_url(args.url), schema_name(args.schema)
    migrate.downgrade(
        url, schema, args.revision, sql=args.sql, force=args.force, lock_timeout=args.lock_timeout
    )
    if not args.sql:
        current = migrate.revisions(url, schema).current
        print(f"# {url.safe} schema {schema!r}: at {', '.join(current) or 'base (no tables)'}")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    from outbox import migrate  # Alembic, imported by the commands that use it

    url, schema = database_url(args.url), schema_name(args.schema)
    revs = migrate.revisions(url, schema)
    if not revs.current:
        print(f"base (nothing applied; head is {revs.head}): run `outbox db upgrade`")
        return 1
    suffix = " (head)" if revs.up_to_date else f" (head is {revs.head}: run `outbox db upgrade`)"
    print(", ".join(revs.current) + suffix)
    return 0


def cmd_adopt_debezium(args: argparse.Namespace) -> int:
    url, schema = database_url(args.url), schema_name(args.schema)
    table_schema = args.table_schema or schema
    name = f"{table_schema}.{args.table}"
    pairs = [text.partition("=") for text in args.set]
    if bad := next((text for text, (_, sep, _) in zip(args.set, pairs, strict=True) if not sep), None):
        raise error("ADOPT_OPTION_MALFORMED", text=bad)
    router = debezium.Router.of({key.strip(): value.strip() for key, _, value in pairs})
    with connect(url, autocommit=True) as conn:
        try:
            if args.undo:
                had = debezium.uninstall(conn, table_schema, args.table, args.lock_timeout)
                print(f"# {name}: {'trigger taken away' if had else 'had no trigger: nothing changed'}")
                return 0
            tables.require(conn, url, schema, (tables.OUTBOX_EVENTS,))
            debezium.install(conn, table_schema, args.table, schema, router, args.lock_timeout)
        except psycopg.errors.LockNotAvailable:
            raise error("ADOPT_LOCK_TIMEOUT", table=name, seconds=args.lock_timeout) from None
        except psycopg.Error as exc:
            raise error("ADOPT_DATABASE_ERROR", url=url.safe, reason=reason(exc, url)) from None
    print(
        f"# {name}: each row inserted is copied into {schema}.{tables.OUTBOX_EVENTS} ({router.describe()});"
        f" run the relay with --event-id-header {debezium.ID_HEADER}"
    )
    return 0
