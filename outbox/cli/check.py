"""`outbox check`: can this machine reach what the framework needs?

One line per item, so a platform team can run it as a readiness probe: FAIL
items make it exit 1; WARN items are for a person to look at.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from outbox.core import tables
from outbox.core.config import DatabaseUrl, bootstrap_servers, database_url, schema_name
from outbox.core.errors import OutboxError
from outbox.core.postgres import connect, pooled
from outbox.core.probe import check_kafka, check_postgres
from outbox.errors import error


class Notice(Exception):
    """Something for a person to look at, not a failure: printed as WARN."""


def leftover_stages(url: DatabaseUrl, schema: str) -> list[str]:
    """Sinks' stage tables in `schema`: each lives only while a staged batch is applied."""
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r' AND starts_with(c.relname, %s) ORDER BY 1",
            [schema, tables.SINK_STAGE_PREFIX],
        )
        return [name for (name,) in rows]


def txid_trigger(url: DatabaseUrl, schema: str) -> str | None:
    """How PostgreSQL fires the trigger that stamps each outbox row's txid: pg_trigger.tgenabled.
    'A' always, as 0013 makes it; `ENABLE TRIGGER ALL` (which pg_restore --disable-triggers runs
    after a data-only load) sets it back to 'O', origin only; 'D' disabled."""
    with connect(url) as conn:
        row = conn.execute(
            "SELECT t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND t.tgname = %s",
            [schema, tables.OUTBOX_EVENTS, tables.TXID_TRIGGER],
        ).fetchone()
        return None if row is None else str(row[0])


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser("check", help="check PostgreSQL, Kafka, migrations and Java")
    check.add_argument("--url", help="PostgreSQL URL (default: env DATABASE_URL)")
    check.add_argument("--bootstrap-servers", help="Kafka (default: env KAFKA_BOOTSTRAP_SERVERS)")
    check.add_argument(
        "--schema", help="schema of the framework's tables (default: env OUTBOX_SCHEMA or public)"
    )
    check.add_argument("--no-java", action="store_true", help="skip the Java check (relay-only hosts)")
    check.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    def postgres() -> str:
        url = database_url(args.url)
        return f"PostgreSQL {check_postgres(url, writable=True)} at {url.safe}"

    def migrations() -> str:
        from outbox import migrate  # Alembic: a quarter of a second that only this check needs

        url, schema = database_url(args.url), schema_name(args.schema)
        revs = migrate.revisions(url, schema)
        if not revs.up_to_date:
            raise error(
                "DB_NOT_AT_HEAD", schema=schema, current=", ".join(revs.current) or "base", head=revs.head
            )
        return f"schema {schema!r} at head ({revs.head})"

    def stages() -> str:
        url, schema = database_url(args.url), schema_name(args.schema)
        left = leftover_stages(url, schema)
        if not left:
            return f"none left in schema {schema!r}"
        raise Notice(
            f"{len(left)} in schema {schema!r} ({', '.join(left)}), left by staged batches that were"
            " killed (or by a query staging now); a sink drops its own when it next starts: drop"
            " those of sinks that are gone"
        )

    def stamp() -> str:
        url, schema = database_url(args.url), schema_name(args.schema)
        state = txid_trigger(url, schema)
        table = f"{schema}.{tables.OUTBOX_EVENTS}"
        trigger = tables.TXID_TRIGGER
        fix = f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {trigger}"
        if state in (None, "A"):  # None: not migrated yet, which `migrations` says
            return f"{trigger} fires on every insert into {table}"
        if state == "D":
            raise error("DB_TXID_TRIGGER_DISABLED", table=table, trigger=trigger, fix=fix)
        raise Notice(
            f"{trigger} does not fire on a logical replica's apply (an ENABLE TRIGGER ALL, as"
            f" pg_restore --disable-triggers runs, reset it): a relay on a subscriber would never publish"
            f" the rows replication brings; run {fix}"
        )

    def pooler() -> str:
        with connect(database_url(args.url), autocommit=True) as conn:
            if pooled(conn):
                raise Notice(
                    "PostgreSQL is reached through a connection pooler: the relay refuses it (connect it"
                    " directly; one active instance is a session's lock); a sink needs it in session mode"
                )
        return "none (this client reaches PostgreSQL's own session)"

    def kafka() -> str:
        servers = bootstrap_servers(args.bootstrap_servers)
        return f"Kafka at {servers} ({check_kafka(servers)} broker(s))"

    def java() -> str:
        from outbox.core.java import find_java

        found = find_java()
        return f"Java {found.major} at {found.path}"

    checks: list[tuple[str, Callable[[], str]]] = [
        ("postgres", postgres),
        ("migrations", migrations),
        ("txid stamp", stamp),
        ("stage tables", stages),
        ("pooler", pooler),
        ("kafka", kafka),
    ]
    if not args.no_java:
        checks.append(("java", java))
    failed = 0
    for name, check in checks:
        try:
            print(f"ok   {name}: {check()}")
        except Notice as exc:
            print(f"WARN {name}: {exc}")
        except OutboxError as exc:
            failed += 1
            print(f"FAIL {name}: {exc}")
    return 1 if failed else 0
