"""The sink's start-time decisions, as plain functions of schema, table and spec."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError
from sinks.postgres.catalog import Column, Table
from sinks.postgres.plan import plan, same_when_equal
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
    ("fields", "kw", "code", "message"),
    [
        (
            [("event_id", T.StringType()), ("extra", T.StringType())],
            {},
            "SINK_COLUMNS_NOT_IN_TABLE",
            "['extra'] are not in table",
        ),
        (
            [("amount", T.DecimalType(12, 2))],
            {},
            "SINK_REQUIRED_COLUMNS_MISSING",
            "needs columns ['event_id']",
        ),
        (
            [("event_id", T.StringType()), ("amount", T.BooleanType())],
            {},
            "SINK_COLUMN_TYPE_MISMATCH",
            "boolean cannot be written",
        ),
        (
            [("event_id", T.StringType()), ("tags", T.ArrayType(T.TimestampType()))],
            {},
            "SINK_COLUMN_TYPE_MISMATCH",
            "cannot be written",
        ),
        (
            [("event_id", T.StringType()), ("doc", T.LongType())],
            {},
            "SINK_COLUMN_TYPE_MISMATCH",
            "cannot be written",
        ),
        (
            [("event_id", T.StringType()), ("amount", T.LongType())],
            {"key": ("amount",)},
            "SINK_NO_UNIQUE_INDEX",
            "no unique index",
        ),
        (
            [("event_id", T.StringType())],
            {"version": "amount"},
            "SINK_VERSION_COLUMN_ABSENT",
            "version column 'amount' is not",
        ),
        (
            [("event_id", T.StringType()), ("doc", T.StringType())],
            {"version": "doc"},
            "SINK_VERSION_NOT_ORDERED",
            "must be a number",
        ),
    ],
)
def test_mistakes_are_named(fields: list, kw: dict, code: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as caught:
        plan(frame(*fields), TABLE, spec(**kw))
    assert caught.value.code == code


@pytest.mark.parametrize("base", ["time", "timetz"])
def test_a_date_into_a_time_of_day_is_refused_at_start(base: str) -> None:
    """A date has no time of day: each row failed at COPY, after the query had started."""
    table = Table(
        "public",
        "orders",
        {"event_id": column("event_id", "uuid", "U", "uuid"), "at": column("at", base, "D", base)},
        (frozenset({"event_id"}),),
    )
    with pytest.raises(ConfigError) as caught:
        plan(frame(("event_id", T.StringType()), ("at", T.DateType())), table, spec())
    assert caught.value.code == "SINK_COLUMN_TYPE_MISMATCH"
    assert plan(frame(("event_id", T.StringType()), ("at", T.TimestampType())), table, spec())


def test_position_columns_are_required() -> None:
    with pytest.raises(ConfigError) as caught:
        plan(frame(("event_id", T.StringType()), kafka=False), TABLE, spec())
    assert caught.value.code == "SINK_POSITION_COLUMNS_MISSING"


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"key": ()}, "SINK_KEY_MISSING"),
        ({"key": ("a", "a")}, "SINK_KEY_REPEATS"),
        ({"mode": "merge"}, "SETTING_NOT_A_CHOICE"),
        ({"on_error": "ignore"}, "SETTING_NOT_A_CHOICE"),
        ({"apply_in": "executor"}, "SETTING_NOT_A_CHOICE"),
        ({"version": "event_id"}, "SINK_VERSION_IS_KEY"),
        ({"version": "v", "mode": "insert"}, "SINK_VERSION_NEEDS_UPSERT"),
        ({"outbox": Outbox(topic="")}, "SINK_OUTBOX_TOPIC_MISSING"),
        (
            {"outbox": Outbox(topic="t", headers={"event_id": "written.n::text"})},
            "SINK_OUTBOX_HEADER_RESERVED",
        ),
    ],
)
def test_spec_mistakes(kw: dict, code: str) -> None:
    with pytest.raises(ConfigError) as caught:
        spec(**kw)
    assert caught.value.code == code


def test_spec_names_the_sink_by_table_and_hides_the_password() -> None:
    s = spec(schema="sales")
    assert s.name == "sales.orders"
    assert "secret" not in repr(s)


@pytest.mark.parametrize(
    ("type_", "category", "base", "deterministic", "same"),
    [
        ("bigint", "N", "int8", True, True),
        ("text", "S", "text", True, True),
        ("uuid", "U", "uuid", True, True),
        ("timestamp with time zone", "D", "timestamptz", True, True),
        ("mood", "E", "mood", True, True),  # an enum
        ("text", "S", "text", False, False),  # a nondeterministic (case-insensitive) collation
        ("citext", "S", "citext", True, False),
        ("numeric(12,2)", "N", "numeric", True, False),
        ("double precision", "N", "float8", True, False),
        ("jsonb", "U", "jsonb", True, False),
        ("interval", "T", "interval", True, False),
        ("integer[]", "A", "_int4", True, False),
        ("json", "U", "json", True, False),
        ("point", "G", "point", True, False),
    ],
)
def test_columns_whose_equality_is_not_sameness_are_compared_as_text(
    type_: str, category: str, base: str, deterministic: bool, same: bool
) -> None:
    assert (
        same_when_equal(Column("c", type_, category, base, None, False, False, False, deterministic)) is same
    )
