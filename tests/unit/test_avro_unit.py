"""The pure parts of parse_avro: Confluent's framing, Avro's types as Spark's, what is logged of a
registry's address."""

from __future__ import annotations

from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import types as T

from outbox.core.registry import Registry
from outbox.core.wire import frame, framed
from sinks.postgres.avro import spark_type, unions_as_json
from sinks.postgres.avro_resolve import lacking
from sinks.postgres.decoded import converter


@given(st.integers(0, 2**32 - 1), st.binary())
def test_a_framed_value_gives_its_schema_id_and_body(schema_id: int, body: bytes) -> None:
    got = framed(frame(schema_id, body))
    assert not isinstance(got, str)
    assert got[0] == schema_id and bytes(got[1]) == body


@given(st.binary(max_size=4) | st.binary(min_size=1).filter(lambda b: b[0] != 0))
def test_a_value_without_the_magic_byte_and_an_id_is_said_not_framed(value: bytes) -> None:
    assert "magic byte 0" in str(framed(value))


def record(*fields: tuple[str, object]) -> T.DataType:
    schema = {"type": "record", "name": "R", "fields": [{"name": n, "type": t} for n, t in fields]}
    return spark_type(fastavro.parse_schema(schema))


@pytest.mark.parametrize(
    ("avro", "spark"),
    [
        ("long", T.LongType()),
        (["null", "int"], T.IntegerType()),
        (["null", "int", "string"], T.StringType()),  # a union of several types: its JSON text
        ({"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}, T.DecimalType(12, 2)),
        (
            {"type": "fixed", "name": "F", "size": 20, "logicalType": "decimal", "precision": 40},
            T.StringType(),
        ),
        ({"type": "int", "logicalType": "date"}, T.DateType()),
        ({"type": "long", "logicalType": "timestamp-millis"}, T.TimestampType()),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, T.TimestampNTZType()),
        ({"type": "int", "logicalType": "time-millis"}, T.StringType()),
        ({"type": "string", "logicalType": "uuid"}, T.StringType()),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, T.StringType()),
        ({"type": "array", "items": "double"}, T.ArrayType(T.DoubleType())),
        ({"type": "map", "values": "boolean"}, T.MapType(T.StringType(), T.BooleanType())),
        (
            {"type": "record", "name": "In", "fields": [{"name": "a", "type": "bytes"}]},
            T.StructType([T.StructField("a", T.BinaryType())]),
        ),
    ],
)
def test_each_avro_type_has_the_spark_type_its_column_is_written_from(
    avro: object, spark: T.DataType
) -> None:
    assert record(("f", avro)) == T.StructType([T.StructField("f", spark)])


def test_a_named_type_used_twice_and_a_record_that_holds_itself_are_typed() -> None:
    point = {"type": "record", "name": "P", "fields": [{"name": "x", "type": "int"}]}
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    got = record(("a", point), ("b", "P"), ("n", node))
    assert isinstance(got, T.StructType)
    assert got["a"].dataType == got["b"].dataType == T.StructType([T.StructField("x", T.IntegerType())])
    assert got["n"].dataType == T.StructType([T.StructField("next", T.StringType())])


def test_a_union_of_several_types_keeps_its_members_apart_in_json_wherever_it_is_held() -> None:
    """The int 5 and the string "5" are `5` and `"5"`, at the top, in a record, an array and a
    map; a union of null and one type is left as it is, and so is a record within itself (its
    text, made of the whole, keeps the types)."""
    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "R",
            "fields": [
                {"name": "u", "type": ["null", "int", "string"]},
                {"name": "one", "type": ["null", "string"]},
                {"name": "a", "type": {"type": "array", "items": ["int", "string"]}},
                {"name": "m", "type": {"type": "map", "values": ["bytes", "double"]}},
                {
                    "name": "r",
                    "type": {
                        "type": "record",
                        "name": "In",
                        "fields": [{"name": "v", "type": ["int", "string"]}],
                    },
                },
                {
                    "name": "n",
                    "type": {
                        "type": "record",
                        "name": "Node",
                        "fields": [
                            {"name": "next", "type": ["null", "Node"]},
                            {"name": "v", "type": ["int", "string"]},
                        ],
                    },
                },
            ],
        }
    )
    convert = unions_as_json(schema, schema["__named_schemas"])
    assert convert is not None
    inner = {"next": None, "v": 5}  # Node within Node: JSON text as a whole, its types kept
    node = {"next": inner, "v": "5"}
    got = convert(
        {"u": "5", "one": "5", "a": [5, "5"], "m": {"k": b"\xff", "d": 1.5}, "r": {"v": 5}, "n": node}
    )
    assert got == {
        "u": '"5"',
        "one": "5",
        "a": ["5", '"5"'],
        "m": {"k": '"/w=="', "d": "1.5"},
        "r": {"v": "5"},
        "n": {"next": inner, "v": '"5"'},
    }
    assert convert({"u": None, "one": None, "a": [], "m": {}, "r": {"v": "x"}, "n": node})["u"] is None
    plain = fastavro.parse_schema(
        {"type": "record", "name": "P", "fields": [{"name": "x", "type": ["null", "long"]}]}
    )
    assert unions_as_json(plain, {}) is None


def test_values_become_what_arrow_takes_for_their_spark_type() -> None:
    import uuid

    kind = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("m", T.MapType(T.StringType(), T.StringType())),
            T.StructField("n", T.LongType()),
        ]
    )
    convert = converter(kind)
    assert convert is not None
    u = uuid.UUID(int=7)
    assert convert({"id": u, "m": {"k": 1}, "n": 3}) == {"id": str(u), "m": [("k", "1")], "n": 3}
    assert converter(T.LongType()) is None and converter(T.ArrayType(T.LongType())) is None


@given(st.text(min_size=1), st.text(min_size=1))
def test_a_registrys_address_as_logged_holds_no_user_or_password(user: str, password: str) -> None:
    from urllib.parse import quote

    url = f"https://{quote(user, safe='')}:{quote(password, safe='')}@registry.example:8081/apis/ccompat/v7"
    where = Registry.of({"url": url, "basic.auth.user.info": f"{user}:{password}"}).where
    assert where == "https://registry.example:8081/apis/ccompat/v7"


def test_a_value_arrow_cannot_hold_fails_its_record_alone() -> None:
    import pyarrow as pa

    from sinks.postgres.decoded import _column

    field = T.StructField("n", T.LongType())
    errors: list[str | None] = [None, None, "said before", None]
    got = _column(field, [1, 2**70, "x", 4], pa.field("n", pa.int64()), errors)
    assert got.to_pylist() == [1, None, None, 4]
    assert errors == [None, "field 'n': its value is no bigint", "said before", None]


@pytest.mark.parametrize(
    "schema",
    ['{"type": "record"', '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}'],
)
def test_a_reader_schema_that_is_no_avro_is_one_line_at_start(schema: str) -> None:
    from outbox.core.errors import ConfigError
    from sinks.postgres import parse_avro

    with pytest.raises(ConfigError) as refused:
        parse_avro(None, "http://127.0.0.1:9", schema=schema)  # type: ignore[arg-type]  # refused before the frame is read
    assert refused.value.code == "SINK_READER_SCHEMA_INVALID"


def test_a_writer_lacks_the_reader_fields_with_no_default_it_has_not_under_any_name() -> None:
    def record(name: str, *fields: dict[str, Any]) -> dict[str, Any]:
        return {"type": "record", "name": name, "fields": list(fields)}

    inner_w = record("Inner", {"name": "a", "type": "int"})
    inner_r = record("Inner", {"name": "a", "type": "int"}, {"name": "b", "type": "string"})
    writer = fastavro.parse_schema(
        record(
            "R",
            {"name": "id", "type": "long"},
            {"name": "old", "type": "int"},
            {"name": "in", "type": ["null", inner_w]},
        )
    )
    reader = fastavro.parse_schema(
        record(
            "R",
            {"name": "id", "type": "long"},
            {"name": "renamed", "type": "int", "aliases": ["old"]},  # the writer's, by its alias
            {"name": "kept", "type": "string", "default": ""},  # a default: read as it
            {"name": "needed", "type": "string"},
            {"name": "in", "type": ["null", inner_r]},
        )
    )
    assert lacking(writer, reader) == ["needed", "in.b"]
    assert lacking(writer, writer) == []
