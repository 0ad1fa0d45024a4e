"""`outbox check`: can this machine reach what the framework needs?

One line per item, so a platform team can run it as a readiness probe.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from core.config import bootstrap_servers, database_url, schema_name
from core.errors import OutboxError
from core.probe import check_kafka, check_postgres
from outbox import migrate


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
        return f"PostgreSQL {check_postgres(url)} at {url.safe}"

    def migrations() -> str:
        url, schema = database_url(args.url), schema_name(args.schema)
        revs = migrate.revisions(url, schema)
        if not revs.up_to_date:
            raise OutboxError(
                f"schema {schema!r} is at {', '.join(revs.current) or 'base'}, head is {revs.head}:"
                " run `outbox db upgrade`"
            )
        return f"schema {schema!r} at head ({revs.head})"

    def kafka() -> str:
        servers = bootstrap_servers(args.bootstrap_servers)
        return f"Kafka at {servers} ({check_kafka(servers)} broker(s))"

    def java() -> str:
        from outbox.jvm.java import find_java

        found = find_java()
        return f"Java {found.major} at {found.path}"

    checks: list[tuple[str, Callable[[], str]]] = [
        ("postgres", postgres),
        ("migrations", migrations),
        ("kafka", kafka),
    ]
    if not args.no_java:
        checks.append(("java", java))
    failed = 0
    for name, check in checks:
        try:
            print(f"ok   {name}: {check()}")
        except OutboxError as exc:
            failed += 1
            print(f"FAIL {name}: {exc}")
    return 1 if failed else 0
