"""`outbox verify TOPIC`: are the committed records of a topic each there once, in order, and nothing else?

Reads the topic read_committed from its start (or --from-offsets) to its end,
and reports every duplicate event id, every per-key order violation, and,
given a source, every event missing or leaked. One line per finding, then a
summary; exit 1 when anything was found.
"""

from __future__ import annotations

import argparse
import json
import os

import psycopg

from outbox.cli import options
from outbox.core import secrets
from outbox.core.config import bootstrap_servers, database_url
from outbox.core.postgres import connect
from outbox.core.registry import Registry
from outbox.core.tables import EVENT_ID_HEADER
from outbox.errors import error
from outbox.verify.findings import check
from outbox.verify.topic import avro_fields, committed, record


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "verify",
        help="check a topic: duplicates, order per key, missing and leaked events",
        description=__doc__,
    )
    p.add_argument("topic")
    p.add_argument("--bootstrap-servers", help="Kafka host:port list (env KAFKA_BOOTSTRAP_SERVERS)")
    ident = p.add_mutually_exclusive_group()
    ident.add_argument(
        "--id-header",
        default=EVENT_ID_HEADER,
        help=f"header holding the event id (default {EVENT_ID_HEADER})",
    )
    ident.add_argument("--id-field", help="JSON field of the value holding the event id, instead of a header")
    p.add_argument(
        "--order-field", help="JSON field with a per-key sequence or version that must not go down"
    )
    p.add_argument(
        "--registry",
        default=os.environ.get("SCHEMA_REGISTRY_URL"),
        help="schema registry URL: values in Confluent's wire format are read as Avro with their writer"
        " schema for --id-field and --order-field (env SCHEMA_REGISTRY_URL; JSON values still read)",
    )
    p.add_argument(
        "--from-offsets", help='JSON {"partition": offset, ...}: where to start (default: the beginning)'
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--source-topic", help="topic whose committed events must each appear (same id option)"
    )
    source.add_argument("--source-sql", help="query whose first column lists the event ids that must appear")
    p.add_argument("--url", help="PostgreSQL URL for --source-sql (env DATABASE_URL)")
    p.add_argument(
        "--timeout",
        type=options.seconds,
        default=60.0,
        help="seconds to read a topic to its end (default 60)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON object")
    p.set_defaults(handler=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    servers = bootstrap_servers(args.bootstrap_servers)
    ids = {"id_header": None if args.id_field else args.id_header, "id_field": args.id_field}
    given = {
        "--source-topic": args.source_topic,
        "--source-sql": args.source_sql,
        "--order-field": args.order_field,
        "--id-field": args.id_field,
    }
    for flag, value in given.items():
        if value is not None and not value.strip():  # an unset shell variable: a check would be skipped
            raise error("VERIFY_FLAG_EMPTY", flag=flag)
    if args.source_topic == args.topic:  # the events expected read from the events checked
        raise error("VERIFY_SOURCE_IS_TOPIC", topic=args.topic)
    start = _offsets(args.from_offsets)
    if start is not None and (args.source_topic or args.source_sql):
        # The source is whole; the topic's part before the offsets would all be "missing".
        raise error("VERIFY_FROM_OFFSETS_WITH_SOURCE")
    registry = args.registry
    if registry and registry == os.environ.get("SCHEMA_REGISTRY_URL"):  # the environment's own
        registry = secrets.environment_registry(registry)
    decode = avro_fields(Registry.of(registry)) if registry else None
    records = [
        record(m, **ids, order_field=args.order_field, decode=decode)
        for m in committed(servers, args.topic, start, args.timeout)
    ]
    expected: list[str | None] | None = None
    if args.source_topic is not None:
        source = committed(servers, args.source_topic, None, args.timeout)
        expected = [record(m, **ids, order_field=None, decode=decode).event_id for m in source]
    elif args.source_sql is not None:
        expected = _ids_from_sql(args.url, args.source_sql)
    report = check(records, expected)
    for finding in report.findings:
        print(finding.line())
    counts = report.counts()
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no findings"
    print(f"{args.topic}: {report.records} committed records checked: {summary}")
    if args.json:
        print(
            json.dumps({"topic": args.topic, "records": report.records, "ok": report.ok, "findings": counts})
        )
    return 0 if report.ok else 1


def _offsets(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    try:
        offsets = {int(p): int(o) for p, o in json.loads(text).items()}
    except (ValueError, AttributeError, TypeError, OverflowError):  # Overflow: 1e400, Infinity
        raise error("VERIFY_FROM_OFFSETS_MALFORMED", text=text) from None
    if min((*offsets, *offsets.values()), default=0) < 0:  # librdkafka reads -1 as the end, -2 the start
        raise error("VERIFY_FROM_OFFSETS_MALFORMED", text=text)
    return offsets


def _ids_from_sql(url_flag: str | None, query: str) -> list[str | None]:
    url = database_url(url_flag)
    try:
        with connect(url) as conn:
            cursor = conn.execute(query.encode())
            if not cursor.description:
                raise error("VERIFY_SOURCE_SQL_FAILED", reason="the query returns no column of event ids")
            return [None if row[0] is None else str(row[0]) for row in cursor]
    except psycopg.Error as exc:
        raise error("VERIFY_SOURCE_SQL_FAILED", reason=str(exc).strip().splitlines()[0]) from None
