"""`outbox trace EVENT_ID`: one event's path, from its input record to its place in the output topic.

What a tracing sink (PostgresSink(trace=True)) did with each input record of
the event: applied at which version and when, deleted, skipped as a
duplicate or as a stale version; the sink's dead letters that hold it; and
for each outbox event its transaction wrote, whether it waits in the outbox
(since when), was dead-lettered by a relay, or was published, and then, given
Kafka, its partition and offset in the output topic. `--at` keeps the one
input record at that place. Exit 1 when nothing records the event.
`--prune DAYS` deletes trace rows older than that instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

import psycopg

from outbox.cli import options
from outbox.core import tables
from outbox.core.config import KAFKA_BOOTSTRAP_SERVERS, bootstrap_servers, database_url, schema_name
from outbox.core.postgres import connect, reason
from outbox.errors import error
from outbox.trace import gather
from outbox.trace.report import Position, as_json, lines


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = options.database(
        commands.add_parser(
            "trace",
            help="follow one event: input record, what the sink did, outbox, relay, output topic",
            description=__doc__,
        )
    )
    p.add_argument(
        "event", nargs="?", metavar="EVENT_ID", help="the event's key as the sink's table holds it"
    )
    p.add_argument(
        "--at",
        metavar="TOPIC:PARTITION:OFFSET",
        help="only the input record there (a key may have many)",
    )
    p.add_argument(
        "--bootstrap-servers",
        help="Kafka host:port list, to find published events in their topic (env KAFKA_BOOTSTRAP_SERVERS)",
    )
    p.add_argument(
        "--timeout", type=options.seconds, default=30.0, help="seconds to search a topic (default 30)"
    )
    p.add_argument(
        "--id-header",
        default=tables.EVENT_ID_HEADER,
        help="the header the relay puts each event's id in, its --event-id-header"
        f" (default {tables.EVENT_ID_HEADER}; `id` for an outbox adopted from Debezium's)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument("--prune", type=float, metavar="DAYS", help="delete trace rows older than DAYS, then stop")
    p.set_defaults(handler=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    if (args.event is None) == (args.prune is None):
        raise error("TRACE_EVENT_OR_PRUNE")
    url, schema = database_url(args.url), schema_name(args.schema)
    at = Position.parse(args.at) if args.at else None
    with connect(url, autocommit=True, application_name="outbox trace") as conn:
        tables.require(conn, url, schema, gather.USED)
        try:
            if args.prune is not None:
                return _prune(conn, schema, args.prune)
            trace = gather.from_database(conn, schema, args.event)
            if at:
                trace = trace.only(at)
        except psycopg.Error as exc:
            raise error("TRACE_DATABASE_ERROR", url=url.safe, reason=reason(exc, url)) from None
    given = args.bootstrap_servers or os.environ.get(KAFKA_BOOTSTRAP_SERVERS)
    if given:
        trace = gather.in_kafka(trace, bootstrap_servers(given), args.timeout, args.id_header)
    elif any(r.outbox and r.outbox.state in ("published", "waiting") for r in trace.records):
        # A relay records how far it got about once a second: Kafka knows more.
        trace = replace(trace, searched="give --bootstrap-servers to find the outbox events in Kafka")
    if args.json:
        print(json.dumps(as_json(trace)))
    else:
        print("\n".join(lines(trace)))
    return 0 if trace.found else 1


def _prune(conn: psycopg.Connection, schema: str, days: float) -> int:
    if not days >= 0:
        raise error("TRACE_PRUNE_DAYS_INVALID", days=days)
    total = 0
    for deleted in gather.prune(conn, schema, days):
        total += deleted
        print(f"deleted {total} trace row(s) so far", file=sys.stderr)
    print(f"deleted {total} trace row(s) older than {days:g} day(s)")
    return 0
