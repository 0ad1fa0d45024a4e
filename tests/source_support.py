"""Shared pieces of the kafka_rc tests: batch and streaming reads, records that say where they came from."""

from __future__ import annotations

import re
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


# Wrong kafka_rc options, by what is wrong ("bootstrap" stands for the broker's address).
MISTAKES = {
    "no bootstrap": {"subscribe": "t"},
    "no topic": {"kafka.bootstrap.servers": "bootstrap"},
    "unknown option": {"kafka.bootstrap.servers": "bootstrap", "subscribe": "t", "pollTimeout": "1"},
    "missing topic": {"kafka.bootstrap.servers": "bootstrap", "subscribe": "no-such-topic-here"},
}


def mistakes(spark: SparkSession, bootstrap: str) -> dict[str, str | None]:
    """What a batch read with each of MISTAKES tells its caller: the framework's own line out of
    whatever Spark wrapped it in (None where the read went through)."""
    told: dict[str, str | None] = {}
    for what, options in MISTAKES.items():
        given = {k: bootstrap if v == "bootstrap" else v for k, v in options.items()}
        try:
            spark.read.format("kafka_rc").options(**given).load().collect()
            told[what] = None
        except Exception as exc:  # classic and Connect wrap it in classes of their own
            found = re.search(r"(?:ConfigError|OutboxError): (.+)", str(exc))
            told[what] = found[1].strip() if found else str(exc)
    return told
