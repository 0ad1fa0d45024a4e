"""From a Kafka source frame to event columns, keeping what the sink needs."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from outbox.errors import ConfigError

KEEP = ("key", "value", "topic", "partition", "offset")


def parse_json(
    frame: DataFrame,
    schema: str | T.StructType,
    *,
    key_column: str | None = None,
    options: dict[str, Any] | None = None,
) -> DataFrame:
    """Parse the Kafka value as JSON into the schema's columns.

    Keeps the raw key and value (for tombstones and dead letters) and the
    position (topic, partition, offset) that makes the sink exactly-once.
    In a tombstone (null value) `key_column` comes from the Kafka key, so the
    sink knows which row to delete.
    """
    parsed = frame.select(
        F.from_json(F.col("value").cast("string"), schema, options or {}).alias("_event"), *KEEP
    )
    event = parsed.schema["_event"].dataType
    assert isinstance(event, T.StructType)
    clash = [f.name for f in event.fields if f.name in KEEP]
    if clash:
        raise ConfigError(f"schema fields {clash} clash with the Kafka columns of the same name; rename them")
    if key_column is not None and key_column not in event.fieldNames():
        raise ConfigError(f"key_column {key_column!r} is not a field of the schema {event.simpleString()}")

    def field(f: T.StructField) -> Column:
        column = F.col("_event").getField(f.name)
        if f.name == key_column:
            column = F.when(F.col("value").isNull(), F.col("key").cast("string").cast(f.dataType)).otherwise(
                column
            )
        return column.alias(f.name)

    return parsed.select(*(field(f) for f in event.fields), *KEEP)
