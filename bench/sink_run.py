"""One measured Spark run of the sink bench: a stream through a batch function, timed, with its rows,
Spark's phases of a batch, and the machine's CPU and the JVM's garbage collection per row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from cpu import Mark, measured  # bench/cpu.py

from outbox.core.config import DatabaseUrl


def figures(rows: list[int], seconds: list[float]) -> dict[str, float]:
    return {
        "rows": sum(rows),
        "batches": len(rows),
        "whole_run_per_s": sum(rows) / sum(seconds),
        "steady_per_s": sum(rows[1:]) / sum(seconds[1:]) if len(rows) > 1 else float("nan"),
    }


def stream(spark, source: str, servers: str, topic: str, per_batch: int):  # type: ignore[no-untyped-def]
    """`topic` from its start, `per_batch` records a micro-batch, through Spark's Kafka source
    (read_committed) or kafka_rc (which reads committed records only)."""
    frame = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
    )
    if source == "kafka":
        frame = frame.option("kafka.isolation.level", "read_committed")
    return frame.load()


class Recorded:
    """A sink's batch function that keeps each batch's result."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.results: list[Any] = []

    def __call__(self, batch: Any, batch_id: int) -> None:
        self.writer(batch, batch_id)
        self.results.append(self.writer.last)

    @property
    def sizes(self) -> Callable[[], list[int]] | None:
        """Each batch's events where the sink's tasks read Kafka themselves: Spark's progress counts
        no input row of such a batch (docs/sink.md)."""
        if self.writer.reads_kafka is None:
            return None
        return lambda: [r.staged for r in self.results]


def settle(url: DatabaseUrl) -> None:
    """Let PostgreSQL finish the last run's leftovers (vacuum, dirty pages) before the next run starts,
    so that no writer's CPU figure pays for the one before it."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def run(  # type: ignore[no-untyped-def]
    frame,
    each_batch: Callable,
    checkpoint: Path,
    total: int,
    sizes: list[int] | Callable[[], list[int]] | None = None,
) -> dict:
    """Stream `frame` (which holds `total` records) through `each_batch`, timed and measured.

    sizes: the events each batch holds, where Spark's progress does not count them: a frame of offset
    ranges, or a sink whose tasks read Kafka themselves (known once the run is over: a callable).

    Spark counts a source's rows once per read: a range repartition reads each
    micro-batch twice, once to sample the ranges' bounds, so its numInputRows is
    twice the rows. A batch's rows are its share of `total`, each counted once.
    CPU is counted as the steady rate is, without the first batch: from the end
    of its work to the end of the last batch's (the query's start, planning and
    first job cost some CPU-seconds, and would weigh on a short run's figure).
    """
    marks: list[Mark] = []
    collected: list[float] = []  # the JVM's garbage collection seconds so far, at each mark

    def each(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        each_batch(batch, batch_id)
        marks.append(Mark.now())
        collected.append(gc_seconds(frame.sparkSession))

    def go():  # type: ignore[no-untyped-def]
        query = (
            frame.writeStream.foreachBatch(each)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return query

    query, usage = measured(go)
    given = sizes() if callable(sizes) else sizes
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0 or given is not None]
    assert given is None or len(given) == len(batches), (given, len(batches))
    reads = sum(b["numInputRows"] for b in batches) / total if given is None else 1
    rows = [round(b["numInputRows"] / reads) for b in batches] if given is None else given
    result: dict[str, Any] = figures(rows, [b["durationMs"]["triggerExecution"] / 1000 for b in batches])
    result["batches"] = len(batches)
    # Spark's own phases of a steady batch, median ms: addBatch is the writer (its tasks and its own
    # driver work); the rest of triggerExecution is the query's (offsets, planning, the logs).
    steady_batches = batches[1:] or batches
    result["phases_ms"] = {
        phase: round(median(b["durationMs"].get(phase, 0) for b in steady_batches))
        for phase in sorted({k for b in steady_batches for k in b["durationMs"]})
    }
    result["source_reads"] = round(reads, 2)
    result["whole_run_per_s"] = sum(rows) / usage.wall_s
    result["rows_all"] = sum(rows)
    counted, steady = (sum(rows[1:]), marks[-1].since(marks[0])) if len(marks) > 1 else (sum(rows), usage)
    result["cpu_us_per_row"] = steady.cpu_us_per(counted) or float("nan")
    result["cpu_us_per_row_by"] = steady.components_us_per(counted)
    result["gc_us_per_row"] = (collected[-1] - collected[0]) / counted * 1e6 if len(collected) > 1 else 0.0
    return result


def gc_seconds(spark) -> float:  # type: ignore[no-untyped-def]
    """The Spark JVM's garbage collection time so far, all collectors (local mode: driver and tasks)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return sum(max(0, bean.getCollectionTime()) for bean in beans) / 1000


def count(url: DatabaseUrl, table: str) -> int:
    with psycopg.connect(url.libpq) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
