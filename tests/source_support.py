"""Shared pieces of the kafka_rc tests: batch and streaming reads, records that say where they came from."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from tests.helpers import unique


def stream(
    spark: SparkSession, bootstrap: str, topic: str, source: str = "kafka_rc", **options: str
) -> DataFrame:
    """A streaming read of `topic` from its start: kafka_rc, or Spark's own "kafka" source read_committed."""
    reader = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if source == "kafka":
        reader = reader.option("kafka.isolation.level", "read_committed")
    return reader.options(**options).load()


def batch_read(spark: SparkSession, bootstrap: str, topic: str, **options: str) -> list:
    reader = (
        spark.read.format("kafka_rc")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("pollTimeoutMs", "10000")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


def stream_to_memory(
    spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path, *, available_now: bool, **options: str
) -> tuple[StreamingQuery, str]:
    """A kafka_rc stream into a memory table; returns the query and the table's name."""
    table = unique("sink")
    writer = (
        stream(spark, bootstrap, topic, **options)
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(checkpoint))
    )
    trigger = {"availableNow": True} if available_now else {"processingTime": "200 milliseconds"}
    return writer.trigger(**trigger).start(), table


def records(n: int, tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 7}".encode(), f"{tag}-{i}".encode()) for i in range(n)]
