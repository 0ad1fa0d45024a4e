"""The type decisions of `create` and `evolve` (sinks/postgres/evolve.py), alone."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from outbox.core.errors import ConfigError
from sinks.postgres.catalog import Column
from sinks.postgres.evolve import column_type, narrower, widened

# What the catalog says of each type create makes: (category, typname).
CATALOG = {
    "text": ("S", "text"),
    "boolean": ("B", "bool"),
    "smallint": ("N", "int2"),
    "integer": ("N", "int4"),
    "bigint": ("N", "int8"),
    "real": ("N", "float4"),
    "double precision": ("N", "float8"),
    "date": ("D", "date"),
    "timestamp with time zone": ("D", "timestamptz"),
    "timestamp without time zone": ("D", "timestamp"),
    "bytea": ("U", "bytea"),
    "jsonb": ("U", "jsonb"),
}
SCALARS = [
    T.StringType(),
    T.BooleanType(),
    T.ByteType(),
    T.ShortType(),
    T.IntegerType(),
    T.LongType(),
    T.FloatType(),
    T.DoubleType(),
    T.DateType(),
    T.TimestampType(),
    T.TimestampNTZType(),
    T.BinaryType(),
    T.DecimalType(12, 2),
    T.DecimalType(38, 0),
]


def column(type_: str) -> Column:
    if type_.startswith("numeric"):
        category, base = "N", "numeric"
    elif type_.endswith("[]"):
        category, base = "A", "_" + CATALOG[type_[:-2]][1]
    else:
        category, base = CATALOG[type_]
    return Column("c", type_, category, base, None, False, False, False)


@pytest.mark.parametrize("kind", SCALARS, ids=lambda k: k.simpleString())
def test_a_column_create_makes_takes_every_value_of_its_field(kind: T.DataType) -> None:
    assert not narrower(kind, column(column_type(kind)))


@pytest.mark.parametrize(
    ("kind", "made"),
    [
        (T.ArrayType(T.LongType()), "bigint[]"),
        (T.ArrayType(T.StringType()), "text[]"),
        (T.ArrayType(T.ArrayType(T.LongType())), "jsonb"),
        (T.ArrayType(T.TimestampType()), "jsonb"),
        (T.MapType(T.StringType(), T.LongType()), "jsonb"),
        (T.StructType([T.StructField("a", T.LongType())]), "jsonb"),
        (T.DecimalType(12, 2), "numeric(12,2)"),
    ],
)
def test_nested_and_decimal_fields_get_the_columns_the_sink_writes_them_to(
    kind: T.DataType, made: str
) -> None:
    assert column_type(kind) == made


@pytest.mark.parametrize(
    ("kind", "type_", "narrows"),
    [
        (T.StringType(), "integer", True),  # text into an integer
        (T.StringType(), "text", False),
        (T.StringType(), "jsonb", False),  # JSON text into jsonb, as the sink always wrote it
        (T.LongType(), "integer", True),
        (T.IntegerType(), "bigint", False),
        (T.IntegerType(), "numeric(10,0)", False),
        (T.LongType(), "numeric(12,0)", True),
        (T.DecimalType(14, 2), "numeric(12,2)", True),  # a wider decimal
        (T.DecimalType(12, 4), "numeric(12,2)", True),  # a finer scale
        (T.DecimalType(10, 2), "numeric(12,2)", False),
        (T.DecimalType(9, 0), "integer", False),
        (T.DecimalType(10, 0), "integer", True),
        (T.DecimalType(5, 1), "bigint", True),
        (T.DoubleType(), "real", True),
        (T.DoubleType(), "bigint", True),
        (T.FloatType(), "double precision", False),
        (T.BooleanType(), "boolean", False),
    ],
)
def test_a_field_narrower_than_its_column_is_told(kind: T.DataType, type_: str, narrows: bool) -> None:
    assert narrower(kind, column(type_)) is narrows


@pytest.mark.parametrize(
    ("kind", "type_"),
    [
        (T.DecimalType(14, 2), "numeric(12,2)"),
        (T.DecimalType(12, 4), "numeric(12,2)"),
        (T.DecimalType(5, 1), "bigint"),
        (T.LongType(), "integer"),
        (T.StringType(), "integer"),
        (T.DoubleType(), "real"),
    ],
)
def test_the_alter_named_takes_both_the_old_values_and_the_new(kind: T.DataType, type_: str) -> None:
    to = column(widened(kind, column(type_)))
    assert not narrower(kind, to)
    old = {"integer": T.IntegerType(), "bigint": T.LongType(), "real": T.FloatType()}.get(
        type_, T.DecimalType(12, 2)
    )
    if to.category == "N":
        assert not narrower(old, to)


def test_a_type_with_no_column_of_its_own_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        column_type(T.DayTimeIntervalType())
    assert refused.value.code == "SINK_FIELD_TYPE_UNMAPPED"
