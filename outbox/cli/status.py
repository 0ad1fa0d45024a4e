"""`outbox status`: every relay, sink ledger and dead-letter table of an outbox's database, on one screen.

Per relay shard: running or not, committed rows it has not published yet and
the age of the oldest. Per sink and topic-partition: the next offset to
apply and, given Kafka, the lag to the high watermark and the records held
beyond the LSO by open transactions. Dead letters per sink and relay. With
--transactions, the open and hanging transactions on those topics too (this
starts Kafka's own tool, a JVM: seconds more).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from datetime import UTC, datetime

import psycopg

from outbox.cli import options, transactions
from outbox.core import tables
from outbox.core.config import KAFKA_BOOTSTRAP_SERVERS, bootstrap_servers, database_url, schema_name
from outbox.core.postgres import connect, reason
from outbox.errors import error
from outbox.status import gather
from outbox.status.report import Status, as_json, lines


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = options.database(
        commands.add_parser(
            "status",
            help="relays, sink ledgers and dead letters on one screen: what waits, what lags",
            description=__doc__,
        )
    )
    p.add_argument(
        "--bootstrap-servers",
        help="Kafka host:port list, for the sinks' lag (env KAFKA_BOOTSTRAP_SERVERS; without: no lag)",
    )
    p.add_argument(
        "--transactions",
        action="store_true",
        help="also list open and hanging transactions on the topics involved (needs Kafka)",
    )
    p.add_argument(
        "--older-than",
        type=float,
        default=60.0,
        help="seconds after which an open transaction is LONG-OPEN (default 60)",
    )
    p.add_argument(
        "--timeout", type=options.seconds, default=10.0, help="seconds Kafka may take to answer (default 10)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    p.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    url, schema = database_url(args.url), schema_name(args.schema)
    with connect(url, autocommit=True, application_name="outbox status") as conn:
        tables.require(conn, url, schema, gather.USED)
        try:
            status = gather.from_database(conn, schema)
        except psycopg.Error as exc:
            raise error("STATUS_DATABASE_ERROR", url=url.safe, reason=reason(exc, url)) from None
    given = args.bootstrap_servers or os.environ.get(KAFKA_BOOTSTRAP_SERVERS)
    if args.transactions and not given:
        bootstrap_servers(None)  # the one error for a missing Kafka, with its remedy
    if given:
        servers = bootstrap_servers(given)
        status = gather.with_topic_ends(status, servers, args.timeout)
        if args.transactions:
            status = _with_transactions(status, servers, args.older_than)
    if args.json:
        print(json.dumps(as_json(status)))
    else:
        print("\n".join(lines(status, datetime.now(UTC))))
    return 0


def _with_transactions(status: Status, servers: str, older_than: float) -> Status:
    opened, stuck = transactions.find(servers, status.topics)
    found = [o.line(older_than) for o in opened] + [h.line(servers) for h in stuck]
    return replace(status, transactions=tuple(found))
