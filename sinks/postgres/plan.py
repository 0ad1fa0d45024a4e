"""Which DataFrame columns go where, and how each is turned into COPY text.

Plain functions of the DataFrame schema, the table's catalog entry and the
spec, so every start-time error is decided here and can be tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyspark.sql import types as T

from sinks.errors import error
from sinks.postgres.catalog import Column, Table
from sinks.postgres.spec import SinkSpec

# Columns of a Kafka source frame: used for position, dead letters and deletes,
# written only where the table has a column of the same name.
KAFKA_COLUMNS = frozenset(
    {"key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"}
)

# Set by parse_json on a row whose value did not parse as its schema: the sink dead-letters it.
ERROR_COLUMN = "_error"

# How a column reaches COPY: Arrow as is, bytea hex, a PostgreSQL array literal, JSON text, or
# a fraction (decimal, float) into an integer column: its integral values as integers.
Conversion = Literal["native", "hex", "array", "json", "integral"]

_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)
_INTEGERS = {"int2", "int4", "int8"}
_DATETIME = (T.TimestampType, T.TimestampNTZType, T.DateType)
_JSON = {"json", "jsonb"}


@dataclass(frozen=True)
class Plan:
    columns: tuple[str, ...]  # written, in DataFrame order
    conversions: dict[str, Conversion]
    raw_key: str | None  # binary Kafka key/value kept for dead letters
    raw_value: str | None
    error: str | None  # the frame's parse-error column, if it has one
    no_equality: frozenset[str]  # columns compared as text to spot a real change (see same_when_equal)


def plan(schema: T.StructType, table: Table, spec: SinkSpec) -> Plan:
    fields = {f.name: f.dataType for f in schema.fields}
    qualified = f"{table.schema}.{table.name}"
    _check_position(fields)

    unknown = [n for n in fields if n not in table.columns and n not in KAFKA_COLUMNS | {ERROR_COLUMN}]
    if unknown:
        raise error(
            "SINK_COLUMNS_NOT_IN_TABLE", columns=unknown, table=qualified, table_columns=list(table.columns)
        )
    columns = tuple(n for n in fields if n in table.columns and n != ERROR_COLUMN)
    generated = [n for n in columns if table.columns[n].generated]
    if generated:
        raise error("SINK_COLUMNS_GENERATED", columns=generated, table=qualified)
    missing = [
        c.name for c in table.columns.values() if c.not_null and not c.has_default and c.name not in fields
    ]
    if missing:
        raise error("SINK_REQUIRED_COLUMNS_MISSING", table=qualified, columns=missing)
    absent_keys = [k for k in spec.key if k not in columns]
    if absent_keys:
        raise error("SINK_KEY_COLUMNS_ABSENT", columns=absent_keys, table=qualified)
    if frozenset(spec.key) not in table.unique_keys:
        raise error(
            "SINK_NO_UNIQUE_INDEX",
            table=qualified,
            key=list(spec.key),
            name=table.name,
            columns=", ".join(spec.key),
        )
    if spec.version is not None:
        if spec.version not in columns:
            raise error("SINK_VERSION_COLUMN_ABSENT", version=spec.version, table=qualified)
        if table.columns[spec.version].category not in "ND":
            raise error(
                "SINK_VERSION_NOT_ORDERED", version=spec.version, type=table.columns[spec.version].type
            )

    conversions = {n: conversion(n, fields[n], table) for n in columns}

    def raw(name: str) -> str | None:
        """Kafka's binary key or value, also when a column of the table of that name is written from it:
        a tombstone is a null value whatever the table calls its columns."""
        return name if isinstance(fields.get(name), T.BinaryType) else None

    no_equality = frozenset(n for n in columns if not same_when_equal(table.columns[n]))
    parse_error = ERROR_COLUMN if isinstance(fields.get(ERROR_COLUMN), T.StringType) else None
    return Plan(columns, conversions, raw("key"), raw("value"), parse_error, no_equality)


# Types whose `=` holds between identical values only. An update is skipped as no change when the
# row's values equal the event's, so every other column is compared as text: citext ('Bob' = 'bob'),
# numeric (1.5 = 1.50), jsonb ({"p": 1} = {"p": 1.0}), floats (0 = -0), interval ('1 day' = '24:00'),
# inet, and the types with no `=` at all (json, xml, geometry).
_EQUAL_IS_SAME = frozenset(
    {
        "int2",
        "int4",
        "int8",
        "bool",
        "text",
        "varchar",
        "bpchar",
        "uuid",
        "bytea",
        "date",
        "time",
        "timestamp",
        "timestamptz",
    }
)


def same_when_equal(column: Column) -> bool:
    """Whether two values of the column that `=` calls equal are the same value."""
    return column.deterministic and (column.base in _EQUAL_IS_SAME or column.category == "E")


def _check_position(fields: dict[str, T.DataType]) -> None:
    wanted = {"topic": T.StringType, "partition": T.IntegerType, "offset": T.LongType}
    bad = [n for n, kind in wanted.items() if not isinstance(fields.get(n), kind)]
    if bad:
        raise error("SINK_POSITION_COLUMNS_MISSING", columns=bad)


def conversion(name: str, kind: T.DataType, table: Table) -> Conversion:
    column = table.columns[name]
    if isinstance(kind, T.StringType | T.VarcharType | T.CharType):
        return "native"
    fraction = isinstance(kind, T.FloatType | T.DoubleType) or (
        isinstance(kind, T.DecimalType) and kind.scale
    )
    if fraction and column.base in _INTEGERS:
        return "integral"
    if isinstance(kind, _NUMERIC) and column.category in "NS":
        return "native"
    if isinstance(kind, T.BooleanType) and column.category in "BS":
        return "native"
    time_of_day = isinstance(kind, T.DateType) and column.base in ("time", "timetz")  # a date has none
    if isinstance(kind, _DATETIME) and column.category in "DS" and not time_of_day:
        return "native"
    if isinstance(kind, T.BinaryType) and column.base == "bytea":
        return "hex"
    if isinstance(kind, T.ArrayType | T.MapType | T.StructType) and column.base in _JSON:
        return "json"
    if (
        isinstance(kind, T.ArrayType)
        and column.category == "A"
        and _element_fits(kind.elementType, column.element_category or "")
    ):
        return "array"
    raise error(
        "SINK_COLUMN_TYPE_MISMATCH",
        column=name,
        spark_type=kind.simpleString(),
        table=f"{table.schema}.{table.name}",
        type=column.type,
    )


def _element_fits(kind: T.DataType, category: str) -> bool:
    # Dates and times in arrays would go through Spark's local-time text; write them as JSON instead.
    if isinstance(kind, T.StringType):
        return True
    if isinstance(kind, _NUMERIC):
        return category in "NS"
    if isinstance(kind, T.BooleanType):
        return category in "BS"
    return False
