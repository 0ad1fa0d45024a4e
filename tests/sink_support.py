"""What the sink tests share: the orders table, events for it, and reading back table, ledger and log."""

from __future__ import annotations

import json
import logging
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql.types import StructType

from outbox.core.config import DatabaseUrl
from outbox_dev.jvm import kafka_tools
from sinks.postgres import PostgresSink, parse_json
from tests.helpers import Job, produce_transaction, read_committed, transactional_producer
from tests.source_support import stream

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
    tasks: bool = True,
    **options: str,
) -> PostgresSink:
    """One availableNow run of the sink from the topic's start; `sink.last` tells what its last batch did.

    source: "kafka_rc", or "kafka" for Spark's own Kafka source (read_committed).
    tasks: whether the run must apply in the tasks (else staged, on the driver).
    """
    frame = parse_json(stream(spark, bootstrap, topic, source, **options), schema, key_column="event_id")
    query = sink.start(frame, str(checkpoint), trigger={"availableNow": True})
    assert sink.route is not None and sink.route.tasks == tasks, sink.route
    query.awaitTermination()
    return sink


def orders_stream(spark, bootstrap: str, topic: str, max_offsets: str, versioned: bool = False):  # type: ignore[no-untyped-def]
    """The kill -9 jobs' input: the topic's orders through kafka_rc, `max_offsets` per batch, a
    task per partition (the fault tests hold, fail or kill one partition's task)."""
    raw = stream(spark, bootstrap, topic, maxOffsetsPerTrigger=max_offsets, minRecordsPerTask="1")
    columns = SCHEMA if versioned else "event_id string, n long, amount decimal(12,2)"
    return parse_json(raw, columns, key_column="event_id")


KAFKA = "key binary, value binary, topic string, partition int, offset long"
Record = tuple[bytes | None, bytes | None]


def apply_batches(  # type: ignore[no-untyped-def]
    spark,
    sink: PostgresSink,
    batches: list[list[Record]],
    schema: str | StructType = SCHEMA,
    tasks: bool = True,
    key_column: str | None = "event_id",
):
    """Hand each list of records to the sink's batch writer as one micro-batch, as foreachBatch would.

    The records are one Kafka partition (topic "t", partition 0), offsets
    running on across batches; no stream, no broker. Returns the writer
    (`.last` is what its last batch did). tasks: apply in one task (one Spark
    partition), else staged on the driver.
    """
    offset, writer = 0, None
    for batch_id, records in enumerate(batches):
        rows = [(k, v, "t", 0, offset + i) for i, (k, v) in enumerate(records)]
        offset += len(records)
        raw = spark.createDataFrame(rows, KAFKA)
        frame = parse_json(raw.coalesce(1) if tasks else raw, schema, key_column=key_column)
        writer = writer or sink.writer(frame)
        assert writer.route.tasks == tasks, writer.route
        writer(frame, batch_id)
    return writer


def table(pg: psycopg.Connection, name: str = "orders") -> dict[str, tuple]:
    rows = pg.execute(
        sql.SQL("SELECT event_id::text, n, amount, version FROM {}").format(sql.Identifier(name))
    )
    return {r[0]: r[1:] for r in rows}


def ledger(pg: psycopg.Connection) -> dict[int, int]:
    return dict(pg.execute("SELECT kafka_partition, next_offset FROM sink_progress").fetchall())


def stage_tables(pg) -> int:  # type: ignore[no-untyped-def]
    return pg.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'sink_stage_%'").fetchone()[0]


def log_ends(bootstrap: str, topic: str, partitions: int = 2) -> dict[int, int]:
    """Per partition, one past the last committed record: where the ledger must stand."""
    ends: dict[int, int] = {}
    for partition, offset, _, _ in read_committed(bootstrap, topic, partitions):
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def produce_orders(bootstrap: str, topic: str, count: int) -> dict[str, tuple]:
    """`count` events in transactions of 250, with redeliveries, edits and an aborted transaction."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    producer = transactional_producer(bootstrap)
    expected: dict[str, tuple] = {}
    for start in range(0, count, 250):
        chunk = [event(i, n) for n, i in enumerate(ids[start : start + 250], start)]
        produce_transaction(producer, topic, chunk + chunk[:25])  # redelivered duplicates
        expected.update(
            {i: (n, Decimal("1.00"), None) for n, i in enumerate(ids[start : start + 250], start)}
        )
    edits = ids[: count // 10]
    produce_transaction(producer, topic, [event(i, expected[i][0], "9.99") for i in edits])
    expected.update({i: (expected[i][0], Decimal("9.99"), None) for i in edits})
    produce_transaction(producer, topic, [event(ids[0], -1, "0.00")], commit=False)
    return expected


def check_exactly_once(
    pg: psycopg.Connection,
    bootstrap: str,
    topic: str,
    expected: dict[str, tuple],
    dead: int = 0,
    deleted: int = 0,
    partitions: int = 2,
) -> None:
    """Table, ledger, outbox and `dead` dead letters as if every committed record was applied once;
    `deleted`: events inserted, then deleted by a tombstone."""
    assert table(pg) == expected
    assert ledger(pg) == log_ends(bootstrap, topic, partitions)
    # One outbox event per change: each insert, edit and delete; no redelivery, replay or restart adds one.
    changes = len(expected) + sum(1 for v in expected.values() if v[1] == Decimal("9.99")) + 2 * deleted
    (events,) = pg.execute("SELECT count(*) FROM outbox_events").fetchone() or (None,)
    assert events == changes, f"{events} outbox events for {changes} changes: a change applied twice or never"
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (dead,)


def check_with_console(pg: psycopg.Connection, bootstrap: str, topic: str, dead: int = 0) -> None:
    """The table as Kafka's own console consumer (read_committed) says it must be: each committed
    event's last record applied once, no aborted one, and each record that is no JSON a dead letter."""
    wanted: dict[str, tuple] = {}
    poison = 0
    rows = table(pg)
    read = kafka_tools.console_consume(bootstrap, topic, expected=bool(rows) or dead > 0)
    for record in sorted(read, key=lambda r: (r.partition, r.offset)):
        try:
            body = json.loads(record.value or "")
        except json.JSONDecodeError:
            poison += 1
            continue
        wanted[body["event_id"]] = (body["n"], Decimal(body["amount"]), body.get("version"))
    assert rows == wanted
    assert poison == dead
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (dead,)


def waiting_on_a_lock(pg: psycopg.Connection) -> int:
    return pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()[0]


def produce_poison(bootstrap: str, topic: str) -> int:
    """Records that become dead letters: applied twice, they would be there twice."""
    poison = [(f"p{i}".encode(), b"{not json") for i in range(10)]
    produce_transaction(transactional_producer(bootstrap), topic, poison)
    return len(poison)


def hold_partition_1(blocker: psycopg.Connection, topic: str) -> None:
    blocker.execute(
        "INSERT INTO sink_progress (sink, topic, kafka_partition, next_offset)"
        " VALUES ('public.orders', %s, 1, 0)",
        [topic],
    )
    blocker.commit()
    blocker.execute("SELECT 1 FROM sink_progress WHERE kafka_partition = 1 FOR UPDATE")


def partition_0_applied_1_waiting(pg: psycopg.Connection) -> bool:
    return ledger(pg).get(0, 0) > 0 and waiting_on_a_lock(pg) == 1


def sink_job(
    bootstrap: str,
    topic: str,
    db: DatabaseUrl,
    tmp: Path,
    run: str,
    pause_at: int | str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> Job:
    """tests/jobs/sink_job.py on the orders table, 400 records a batch, its checkpoint in `tmp`;
    `pause_at` a batch id, -1, or "start" (see the job); env: SPARK_REMOTE for a Connect client."""
    argv = [bootstrap, topic, db.raw, "orders", str(tmp / "checkpoint"), str(tmp / run), "400", str(pause_at)]
    return Job(["tests/jobs/sink_job.py", *argv, *extra], tmp / f"{run}.log", env or {})


def applied_both_ways(  # type: ignore[no-untyped-def]
    frame_of, db: DatabaseUrl, pg: psycopg.Connection, columns: str, tmp_path: Path, caplog
) -> dict[bool, tuple[list[tuple], list[tuple]]]:
    """A frame (made anew by `frame_of()`) applied into a table of `columns` by tasks that read Kafka
    themselves, and into another from Spark's rows: each one's rows and dead letters (key, error),
    by read_kafka. The tasks must have read every range: none left to Spark's rows."""
    found = {}
    for read_kafka in (True, False):
        table = f"both_{'direct' if read_kafka else 'spark'}"
        pg.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table), sql.SQL(columns)))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="sinks.postgres"):
            sink = PostgresSink(table, url=db.raw, read_kafka=read_kafka)
            sink.start(frame_of(), str(tmp_path / table), trigger={"availableNow": True}).awaitTermination()
        if read_kafka:
            assert "its tasks read the batches' Kafka records themselves" in caplog.text, caplog.text
            assert "applied from Spark's rows" not in caplog.text, caplog.text
        rows = pg.execute(sql.SQL("SELECT * FROM {} ORDER BY 1").format(sql.Identifier(table))).fetchall()
        dead = pg.execute(
            "SELECT key, error FROM sink_dead_letters WHERE sink = %s ORDER BY key", [f"public.{table}"]
        ).fetchall()
        found[read_kafka] = (rows, dead)
    return found
