"""Tables that follow the events: `create=True` makes a missing table, `evolve=True` adds a
column for a field the table lacks. A column is never dropped or narrowed: a field whose type
no longer fits its column stops the query, naming the ALTER TABLE that would take it.

The DDL runs once, when the writer starts (a streaming query's schema is fixed for its run), in
a transaction of its own under a lock keyed by the table, so two sinks starting at once on one
table neither race nor fail. It commits before any batch applies: a crash after it and before
the batch leaves a column with no rows yet, and the replayed batch writes them.

The type decisions are plain functions of Spark's type and the catalog's column.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import types as T

from outbox.migrations import LOCK_TIMEOUT, lock_timeout_setting
from sinks.errors import error
from sinks.postgres.catalog import Column, find
from sinks.postgres.plan import ERROR_COLUMN, KAFKA_COLUMNS
from sinks.postgres.spec import SinkSpec

_SCALARS: tuple[tuple[type[T.DataType], str], ...] = (
    (T.StringType, "text"),
    (T.VarcharType, "text"),
    (T.CharType, "text"),
    (T.BooleanType, "boolean"),
    (T.ByteType, "smallint"),
    (T.ShortType, "smallint"),
    (T.IntegerType, "integer"),
    (T.LongType, "bigint"),
    (T.FloatType, "real"),
    (T.DoubleType, "double precision"),
    (T.DateType, "date"),
    (T.TimestampType, "timestamp with time zone"),
    (T.TimestampNTZType, "timestamp without time zone"),
    (T.BinaryType, "bytea"),
)
# Integers: each type's rank (a wider one takes a narrower one) and the decimal digits it holds whole.
_INTEGER_RANK = {"int2": 1, "int4": 2, "int8": 3}
_INTEGER_DIGITS = {"int2": 4, "int4": 9, "int8": 18}  # digits any value of that many fits in
_SPARK_INTEGERS = {
    T.ByteType: ("int2", 3),
    T.ShortType: ("int2", 5),
    T.IntegerType: ("int4", 10),
    T.LongType: ("int8", 19),
}
_NUMERIC_TYPE = re.compile(r"numeric\((\d+),(\d+)\)")


def column_type(kind: T.DataType) -> str:
    """The PostgreSQL type `create` and `evolve` give a field of Spark type `kind`."""
    if isinstance(kind, T.DecimalType):
        return f"numeric({kind.precision},{kind.scale})"
    for spark, pg in _SCALARS:
        if isinstance(kind, spark):
            return pg
    if isinstance(kind, T.ArrayType) and not isinstance(
        kind.elementType, T.BinaryType | T.DateType | T.TimestampType | T.TimestampNTZType
    ):
        element = column_type(kind.elementType)
        return "jsonb" if element == "jsonb" or element.endswith("[]") else f"{element}[]"
    if isinstance(kind, T.ArrayType | T.MapType | T.StructType):
        return "jsonb"
    raise error("SINK_FIELD_TYPE_UNMAPPED", spark_type=kind.simpleString())


def fields(schema: T.StructType) -> dict[str, T.DataType]:
    """The frame's fields that are the table's columns: not Kafka's own, not the parse error."""
    return {f.name: f.dataType for f in schema.fields if f.name not in KAFKA_COLUMNS | {ERROR_COLUMN}}


def narrower(kind: T.DataType, column: Column) -> bool:
    """Whether some value of Spark type `kind` may not fit `column`: text into a number, a date or a
    boolean; a wider integer or decimal; a fraction into an integer or a fixed scale."""
    numeric = _NUMERIC_TYPE.fullmatch(column.type)
    if isinstance(kind, T.StringType | T.VarcharType | T.CharType):
        return column.category in "NBD"
    integer = next((v for k, v in _SPARK_INTEGERS.items() if isinstance(kind, k)), None)
    if integer is not None:
        base, digits = integer
        if column.base in _INTEGER_RANK:
            return _INTEGER_RANK[base] > _INTEGER_RANK[column.base]
        return numeric is not None and digits > int(numeric[1]) - int(numeric[2])
    if isinstance(kind, T.DecimalType):
        whole = kind.precision - kind.scale
        if column.base in _INTEGER_RANK:
            return kind.scale > 0 or kind.precision > _INTEGER_DIGITS[column.base]
        return numeric is not None and (
            whole > int(numeric[1]) - int(numeric[2]) or kind.scale > int(numeric[2])
        )
    if isinstance(kind, T.FloatType | T.DoubleType):
        return (
            column.base in _INTEGER_RANK
            or numeric is not None
            or (isinstance(kind, T.DoubleType) and column.base == "float4")
        )
    return False


def widened(kind: T.DataType, column: Column) -> str:
    """A type that takes every value the column holds, unchanged, and the field's: what the ALTER
    that SINK_COLUMN_NO_LONGER_FITS names changes the column to."""
    numeric = _NUMERIC_TYPE.fullmatch(column.type)
    digits = _decimal_digits(kind)
    if numeric is not None and digits is not None:
        precision, scale = digits
        whole = max(precision - scale, int(numeric[1]) - int(numeric[2]))
        scale = max(scale, int(numeric[2]))
        return f"numeric({whole + scale},{scale})"
    if isinstance(kind, T.DecimalType) and column.base in _INTEGER_RANK:
        whole = max(kind.precision - kind.scale, _INTEGER_DIGITS[column.base] + 1)
        return f"numeric({whole + kind.scale},{kind.scale})"
    if isinstance(kind, T.FloatType | T.DoubleType) and (numeric is not None or column.base == "int8"):
        return "numeric"  # a double holds neither a bigint's nor a fixed scale's every value
    if isinstance(kind, T.FloatType | T.DoubleType):
        return "double precision"  # every integer and real value, and the field's, exactly
    return column_type(kind)


def _decimal_digits(kind: T.DataType) -> tuple[int, int] | None:
    """The precision and scale of a decimal that takes every value of a Spark decimal or integer."""
    if isinstance(kind, T.DecimalType):
        return kind.precision, kind.scale
    integer = next((v for k, v in _SPARK_INTEGERS.items() if isinstance(kind, k)), None)
    return None if integer is None else (integer[1], 0)


def prepare(conn: psycopg.Connection[Any], spec: SinkSpec, schema: T.StructType) -> list[str]:
    """Make the table (create) and its missing columns (evolve), then check every field fits its
    column; returns what it changed, as lines for the log."""
    wanted = fields(schema)
    table = sql.Identifier(spec.schema, spec.table)
    qualified = f"{spec.schema}.{spec.table}"
    try:
        return _prepared(conn, spec, wanted, table, qualified)
    except psycopg.errors.LockNotAvailable:
        raise error("SINK_TABLE_LOCKED", table=qualified, seconds=LOCK_TIMEOUT) from None


def _prepared(
    conn: psycopg.Connection[Any],
    spec: SinkSpec,
    wanted: dict[str, T.DataType],
    table: sql.Identifier,
    qualified: str,
) -> list[str]:
    done: list[str] = []
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('outbox-sink-ddl:' || %s, 0))", [qualified]
        )
        # The DDL waits LOCK_TIMEOUT for the table's lock, as a migration does: behind a transaction
        # still open on the table, an ALTER would hold up every write to it meanwhile.
        conn.execute("SELECT set_config('lock_timeout', %s, true)", [lock_timeout_setting(LOCK_TIMEOUT)])
        found = find(conn, spec.schema, spec.table)
        if found is None:
            if not spec.create:
                raise error(
                    "SINK_TABLE_NOT_FOUND", schema=spec.schema, table=spec.table, database=conn.info.dbname
                )
            absent = [k for k in spec.key if k not in wanted]
            if absent:
                raise error("SINK_KEY_COLUMNS_ABSENT", columns=absent, table=qualified)
            columns = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(column_type(k))) for n, k in wanted.items()
            )
            key = sql.SQL(", ").join(map(sql.Identifier, spec.key))
            conn.execute(sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(table, columns, key))
            return [f"created {qualified} ({', '.join(f'{n} {column_type(k)}' for n, k in wanted.items())})"]
        if spec.evolve:
            for name, kind in wanted.items():
                if name not in found.columns:
                    conn.execute(
                        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                            table, sql.Identifier(name), sql.SQL(column_type(kind))
                        )
                    )
                    done.append(f"added {qualified}.{name} {column_type(kind)}")
            for name, kind in wanted.items():
                column = found.columns.get(name)
                if column is not None and narrower(kind, column):
                    to = widened(kind, column)
                    raise error(
                        "SINK_COLUMN_NO_LONGER_FITS",
                        table=qualified,
                        column=name,
                        type=column.type,
                        spark_type=kind.simpleString(),
                        alter=sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::{}")
                        .format(table, sql.Identifier(name), sql.SQL(to), sql.Identifier(name), sql.SQL(to))
                        .as_string(conn),
                    )
    return done
