"""`outbox db upgrade | downgrade | current`: the framework's own schema migrations."""

from __future__ import annotations

import argparse

from outbox import migrate
from outbox._core.config import database_url, schema_name
from outbox.cli import options


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


def _lock_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-timeout",
        type=options.seconds,
        default=migrate.LOCK_TIMEOUT,
        metavar="SECONDS",
        help="how long a statement waits for a table's lock, then the run changes nothing"
        f" (default {migrate.LOCK_TIMEOUT:g})",
    )


def cmd_upgrade(args: argparse.Namespace) -> int:
    url, schema = database_url(args.url), schema_name(args.schema)
    migrate.upgrade(url, schema, args.revision, sql=args.sql, lock_timeout=args.lock_timeout)
    if not args.sql:
        print(f"# {url.safe} schema {schema!r}: at {', '.join(migrate.revisions(url, schema).current)}")
    return 0


def cmd_downgrade(args: argparse.Namespace) -> int:
    url, schema = database_url(args.url), schema_name(args.schema)
    migrate.downgrade(
        url, schema, args.revision, sql=args.sql, force=args.force, lock_timeout=args.lock_timeout
    )
    if not args.sql:
        current = migrate.revisions(url, schema).current
        print(f"# {url.safe} schema {schema!r}: at {', '.join(current) or 'base (no tables)'}")
    return 0


def cmd_current(args: argparse.Namespace) -> int:
    url, schema = database_url(args.url), schema_name(args.schema)
    revs = migrate.revisions(url, schema)
    if not revs.current:
        print(f"base (nothing applied; head is {revs.head}): run `outbox db upgrade`")
        return 1
    suffix = " (head)" if revs.up_to_date else f" (head is {revs.head}: run `outbox db upgrade`)"
    print(", ".join(revs.current) + suffix)
    return 0
