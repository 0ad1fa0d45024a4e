"""What the sink tests share: the orders table, events for it, and reading back table, ledger and log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.types import StructType

from sinks.postgres import PostgresSink, parse_json
from tests.helpers import read_committed

SCHEMA = "event_id string, n long, amount decimal(12,2), version int"
ORDERS = (
    "CREATE TABLE orders (event_id uuid PRIMARY KEY, n bigint NOT NULL, amount numeric(12,2), version int)"
)


def event(event_id: str, n: int, amount: str = "1.00", version: int | None = None) -> tuple[bytes, bytes]:
    body: dict[str, Any] = {"event_id": event_id, "n": n, "amount": amount}
    if version is not None:
        body["version"] = version
    return event_id.encode(), json.dumps(body).encode()


def run(  # type: ignore[no-untyped-def]
    spark,
    bootstrap: str,
    topic: str,
    checkpoint: Path,
    sink: PostgresSink,
    schema: str | StructType = SCHEMA,
    source: str = "kafka_rc",
    **options: str,
) -> PostgresSink:
    """One availableNow run of the sink from the topic's start; `sink.last` tells what its last batch did.

    source: "kafka_rc", or "kafka" for Spark's own Kafka source (read_committed).
    """
    reader = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if source == "kafka":
        reader = reader.option("kafka.isolation.level", "read_committed")
    frame = parse_json(reader.options(**options).load(), schema, key_column="event_id")
    sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination()
    return sink


def table(pg: psycopg.Connection, name: str = "orders") -> dict[str, tuple]:
    rows = pg.execute(
        sql.SQL("SELECT event_id::text, n, amount, version FROM {}").format(sql.Identifier(name))
    )
    return {r[0]: r[1:] for r in rows}


def ledger(pg: psycopg.Connection) -> dict[int, int]:
    return dict(pg.execute("SELECT kafka_partition, next_offset FROM sink_progress").fetchall())


def log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition, one past the last committed record: where the ledger must stand."""
    ends: dict[int, int] = {}
    for partition, offset, _, _ in read_committed(bootstrap, topic, 2):
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends
