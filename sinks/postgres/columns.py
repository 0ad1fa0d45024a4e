"""The Spark columns the tasks take from a frame: its data converted to the text PostgreSQL reads,
then the Kafka position, the delete flag, the raw record and the parse error."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from pyspark.sql import Column
from pyspark.sql import functions as F

from sinks.postgres.plan import Conversion, Plan
from sinks.postgres.routing import Delete

__all__ = ["delete_rule", "routed_columns", "staged_columns"]


def staged_columns(plan: Plan, delete: Column) -> list[Column]:
    """The columns the stager copies: data as c0..cN, then position, delete flag, raw record, parse error."""
    return [*_data(plan), *_position(), F.coalesce(delete, F.lit(False)).alias("_delete"), *_kept(plan)]


def routed_columns(plans: Sequence[Plan], deletes: Sequence[Column], route: Column) -> list[Column]:
    """A routed sink's: each lane's data as l{i}_c0..l{i}_cN and delete flag, then the columns the
    lanes share, then the route (routing.Lanes.split takes each lane's rows from these)."""
    lanes = [
        column
        for i, (plan, delete) in enumerate(zip(plans, deletes, strict=True))
        for column in (
            *_data(plan, f"l{i}_"),
            F.coalesce(delete, F.lit(False)).alias(f"l{i}_delete"),
        )
    ]
    return [*lanes, *_position(), *_kept(plans[0]), route]


def _data(plan: Plan, prefix: str = "") -> list[Column]:
    return [_convert(_col(n), plan.conversions[n]).alias(f"{prefix}c{i}") for i, n in enumerate(plan.columns)]


def _position() -> list[Column]:
    return [
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
    ]


def _kept(plan: Plan) -> list[Column]:
    """The raw record, for dead letters, and the parse error."""
    raw = [
        (_col(name) if name else F.lit(None).cast("binary")).alias(alias)
        for name, alias in ((plan.raw_key, "_raw_key"), (plan.raw_value, "_raw_value"))
    ]
    return [*raw, (_col(plan.error) if plan.error else F.lit(None).cast("string")).alias("_parse_error")]


# Spark's to_json writes times to the millisecond unless told: microseconds, as Spark holds them;
# in UTC, for in the session's zone an offset with seconds (most zones before 1900) lost them to
# the format's minutes, and the instant moved. And it leaves a null field out unless told:
# {"a": null} is no {}.
_TO_JSON = {
    "timeZone": "UTC",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "ignoreNullFields": "false",
}


def _col(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _convert(column: Column, how: Conversion) -> Column:
    if how == "hex":
        return F.concat(F.lit("\\x"), F.hex(column))
    if how == "json":
        return F.to_json(column, _TO_JSON)
    if how == "integral":  # 3.00 is written as 3; 2.5 stays as it is, and the table refuses it
        # Through a long: exact for a double too (Spark's cast to decimal goes through its shortest
        # text: 2**60 became ...980). Past a long's range (floor() overflowed there, failing the batch
        # and every replay of it; try_cast gives 2**63 as 2**63 - 1) the value goes as text, and the
        # table refuses it. Decimal bounds: compared exactly with a decimal, and as doubles with a double.
        in_range = (column >= F.lit(Decimal(-(2**63)))) & (column < F.lit(Decimal(2**63)))
        return F.when((column % 1 == 0) & in_range, column.cast("long").cast("string")).otherwise(
            column.cast("string")
        )
    if how == "array":  # a PostgreSQL array literal: {"a","b\"c",NULL}

        def quote(x: Column) -> Column:
            text = F.regexp_replace(F.regexp_replace(x.cast("string"), r"\\", r"\\\\"), '"', r'\\"')
            return F.concat(F.lit('"'), text, F.lit('"'))

        return F.concat(F.lit("{"), F.array_join(F.transform(column, quote), ",", "NULL"), F.lit("}"))
    return column


def delete_rule(delete: Delete, plan: Plan) -> Column:
    """Which of the frame's rows delete their key: the sink's `delete` setting as a Column."""
    if delete is None:
        return F.lit(False)
    if isinstance(delete, Column):
        return delete
    if delete == "tombstone":
        return _col(plan.raw_value).isNull() if plan.raw_value else F.lit(False)
    return F.expr(delete)
