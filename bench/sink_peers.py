"""The sink's peers, each a foreachBatch function: Spark's JDBC append and the upsert users write by
hand, and the bare form of the sink's own design, whose tasks read their ranges from Kafka."""

from __future__ import annotations

import io
import itertools
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pyarrow.csv as pacsv
from sink_plan import ARROW_SCHEMA  # bench/sink_plan.py

from outbox.core.config import DatabaseUrl

# The hand-written peer's stages: rows from Spark, COPY (row by row: encode and send), upsert, commit.
HAND_STAGES = ("input", "copy", "apply", "commit")
# tasks_read_kafka's: the range read from Kafka, its values parsed, encoded as CSV, COPY, apply, commit.
RANGE_STAGES = ("read", "parse", "encode", "copy", "apply", "commit")


def jdbc_append(url: DatabaseUrl, table: str) -> Callable:
    """foreachBatch DataFrame.write.jdbc(mode="append") into `table`: the peer users reach for (not
    idempotent), through the PostgreSQL JDBC driver."""
    # stringtype=unspecified lets PostgreSQL turn the event id string into uuid.
    jdbc_url = f"jdbc:postgresql://{url.raw.split('@', 1)[1]}?stringtype=unspecified"
    user = url.raw.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]

    def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        batch.select("event_id", "n", "amount", "note").write.jdbc(
            jdbc_url,
            table,
            mode="append",
            properties={"user": user, "driver": "org.postgresql.Driver"},
        )

    return each


def hand_written_upsert(libpq: str, table: str, clock: dict[str, Any]) -> Callable:
    """foreachBatch as users write it by hand: each task COPYs its rows, then upserts them.

    clock: a Spark accumulator per stage (HAND_STAGES), which its tasks add their seconds to.
    The rows are taken from Spark before the COPY, so that the source's share can be told apart.
    """

    def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        def task(rows) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            rows = list(rows)
            t1 = time.perf_counter()
            with psycopg.connect(libpq) as conn:
                conn.execute(
                    "CREATE TEMP TABLE incoming (event_id uuid, n bigint, amount numeric(12,2), note text)"
                    " ON COMMIT DROP"
                )
                with conn.cursor().copy("COPY incoming FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                t2 = time.perf_counter()
                conn.execute(
                    f"INSERT INTO {table} SELECT * FROM incoming ON CONFLICT (event_id) DO UPDATE"
                    " SET n = EXCLUDED.n, amount = EXCLUDED.amount, note = EXCLUDED.note"
                )
                t3 = time.perf_counter()
                conn.commit()
            laps = (t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3)
            for stage, seconds in zip(HAND_STAGES, laps, strict=True):
                clock[stage].add(seconds)

        batch.select("event_id", "n", "amount", "note").foreachPartition(task)

    return each


def tasks_read_kafka(libpq: str, bootstrap: str, table: str, tasks: int, clock: dict[str, Any]) -> Callable:
    """foreachBatch over a frame of offset ranges: each of `tasks` tasks reads its ranges from Kafka
    and applies each in a transaction.

    clock: a Spark accumulator per stage (RANGE_STAGES), which the tasks add their seconds to.
    """

    def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        def task(ranges) -> None:  # type: ignore[no-untyped-def]
            from confluent_kafka import Consumer, TopicPartition
            from pyarrow import json as pajson

            for r in ranges:
                laps = [time.perf_counter()]
                consumer = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": "bench-tasks",
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "fetch.max.bytes": 50_000_000,
                        "max.partition.fetch.bytes": 10_000_000,
                    }
                )
                consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
                values: list[bytes] = []
                last = r.start - 1
                # consume(n, t) waits for n records or for t: it asks for no more than are left. The
                # bench's topic has no transactions, so its offsets run on: a range read to its end.
                while last < r.end - 1:
                    got = consumer.consume(min(10_000, r.end - 1 - last), 10.0)
                    if not got:
                        raise RuntimeError(f"{r.topic}-{r.partition}: nothing after offset {last} in 10 s")
                    for m in got:
                        if m.error() is None and m.offset() < r.end:
                            value = m.value()
                            assert value is not None  # the bench wrote each record with a value
                            values.append(value)
                            last = m.offset()
                consumer.close()
                laps.append(time.perf_counter())
                parsed = pajson.read_json(
                    io.BytesIO(b"\n".join(values)),
                    parse_options=pajson.ParseOptions(explicit_schema=ARROW_SCHEMA),
                )
                laps.append(time.perf_counter())
                data = io.BytesIO()
                pacsv.write_csv(parsed, data, pacsv.WriteOptions(include_header=False))
                laps.append(time.perf_counter())
                with psycopg.connect(libpq) as conn:
                    conn.execute(
                        "CREATE TEMP TABLE incoming"
                        " (event_id uuid, n bigint, amount numeric(12,2), note text) ON COMMIT DROP"
                    )
                    conn.execute(
                        "SELECT next_offset FROM bench_ledger WHERE tbl = %s AND p = %s FOR UPDATE",
                        [table, r.partition],
                    )
                    with conn.cursor().copy("COPY incoming FROM STDIN (FORMAT csv)") as copy:
                        copy.write(data.getvalue())
                    laps.append(time.perf_counter())
                    conn.execute(
                        f"INSERT INTO {table} SELECT * FROM incoming ON CONFLICT (event_id) DO UPDATE"
                        " SET n = EXCLUDED.n, amount = EXCLUDED.amount, note = EXCLUDED.note"
                    )
                    conn.execute(
                        "UPDATE bench_ledger SET next_offset = %s WHERE tbl = %s AND p = %s",
                        [r.end, table, r.partition],
                    )
                    laps.append(time.perf_counter())
                    conn.commit()
                laps.append(time.perf_counter())
                for stage, (a, b) in zip(RANGE_STAGES, itertools.pairwise(laps), strict=True):
                    clock[stage].add(b - a)

        batch.repartition(tasks).foreachPartition(task)

    return each
