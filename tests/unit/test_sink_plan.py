"""The sink's start-time decisions, as plain functions of schema, table and spec."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from outbox._core.config import DatabaseUrl
from outbox._core.errors import ConfigError
from sinks.postgres.catalog import Column, Table
from sinks.postgres.plan import plan
from sinks.postgres.spec import Outbox, SinkSpec

URL = DatabaseUrl.parse("postgresql://u:secret@db:5432/app")
KAFKA = [
    T.StructField("key", T.BinaryType()),
    T.StructField("value", T.BinaryType()),
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
]


def column(
    name: str, type_: str, category: str, base: str, *, element: str | None = None, not_null: bool = False
) -> Column:
    return Column(name, type_, category, base, element, not_null, False, False)


TABLE = Table(
    "public",
    "orders",
    {
        "event_id": column("event_id", "uuid", "U", "uuid", not_null=True),
        "amount": column("amount", "numeric(12,2)", "N", "numeric"),
        "doc": column("doc", "jsonb", "U", "jsonb"),
        "tags": column("tags", "text[]", "A", "_text", element="S"),
        "blob": column("blob", "bytea", "U", "bytea"),
        "value": column("value", "text", "S", "text"),
    },
    (frozenset({"event_id"}),),
)


def frame(*fields: tuple[str, T.DataType], kafka: bool = True) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in fields] + (KAFKA if kafka else []))


def spec(**kw: object) -> SinkSpec:
    return SinkSpec(url=URL, table="orders", **kw)  # type: ignore[arg-type]


def test_columns_conversions_and_raw_record() -> None:
    p = plan(
        frame(
            ("event_id", T.StringType()),
            ("amount", T.DecimalType(12, 2)),
            ("doc", T.MapType(T.StringType(), T.IntegerType())),
            ("tags", T.ArrayType(T.StringType())),
            ("blob", T.BinaryType()),
        ),
        Table(
            "public", "orders", {n: c for n, c in TABLE.columns.items() if n != "value"}, TABLE.unique_keys
        ),
        spec(),
    )
    assert p.columns == ("event_id", "amount", "doc", "tags", "blob")
    assert p.conversions == {
        "event_id": "native",
        "amount": "native",
        "doc": "json",
        "tags": "array",
        "blob": "hex",
    }
    assert (p.raw_key, p.raw_value) == ("key", "value")


def test_a_kafka_column_named_like_a_table_column_is_written_not_kept_raw() -> None:
    fields = [f for f in KAFKA if f.name != "value"] + [T.StructField("value", T.StringType())]
    p = plan(T.StructType([T.StructField("event_id", T.StringType()), *fields]), TABLE, spec())
    assert "value" in p.columns and p.raw_value is None


@pytest.mark.parametrize(
    ("fields", "kw", "message"),
    [
        ([("event_id", T.StringType()), ("extra", T.StringType())], {}, "['extra'] are not in table"),
        ([("amount", T.DecimalType(12, 2))], {}, "needs columns ['event_id']"),
        ([("event_id", T.StringType()), ("amount", T.BooleanType())], {}, "boolean cannot be written"),
        ([("event_id", T.StringType()), ("tags", T.ArrayType(T.TimestampType()))], {}, "cannot be written"),
        ([("event_id", T.StringType()), ("doc", T.LongType())], {}, "cannot be written"),
        ([("event_id", T.StringType()), ("amount", T.LongType())], {"key": ("amount",)}, "no unique index"),
        ([("event_id", T.StringType())], {"version": "amount"}, "version column 'amount' is not"),
        ([("event_id", T.StringType()), ("doc", T.StringType())], {"version": "doc"}, "must be a number"),
    ],
)
def test_mistakes_are_named(fields: list, kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        plan(frame(*fields), TABLE, spec(**kw))


def test_position_columns_are_required() -> None:
    with pytest.raises(ConfigError, match="position columns"):
        plan(frame(("event_id", T.StringType()), kafka=False), TABLE, spec())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"key": ()}, "at least one key"),
        ({"key": ("a", "a")}, "repeat"),
        ({"mode": "merge"}, "mode must be"),
        ({"on_error": "ignore"}, "on_error must be"),
        ({"version": "event_id"}, "cannot also be a key"),
        ({"version": "v", "mode": "insert"}, "needs mode='upsert'"),
        ({"outbox": Outbox(topic="")}, "Outbox needs a topic"),
    ],
)
def test_spec_mistakes(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        spec(**kw)


def test_spec_names_the_sink_by_table_and_hides_the_password() -> None:
    s = spec(schema="sales")
    assert s.name == "sales.orders"
    assert "secret" not in repr(s)
