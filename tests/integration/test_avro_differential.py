"""Avro values as the ecosystem reads them: for writer/reader pairs a registry accepts
(tests/avro_cases.py), records written by confluent-kafka's AvroSerializer on Apicurio are decoded
by the Python workers' own decoder (decoded.Decoder, as parse_avro runs it) and compared, column
by column, with what Avro's specification reads, and with what confluent-kafka's AvroDeserializer
returns for the same bytes and reader, except where that deserializer departs from the
specification (fastavro leaves a default as its raw JSON and applies the writer's logical type
only): there the case says so, and the specification wins."""

from __future__ import annotations

import copy
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from outbox.core.registry import Registry
from sinks.postgres import avro, avro_resolve
from sinks.postgres.avro import AvroValues, spark_type
from sinks.postgres.decoded import Decoder, converter
from tests.avro_cases import KINDS, RAW_DEFAULT, Field, Pair, pairs
from tests.conftest import RunningRegistry
from tests.helpers import unique

pytestmark = pytest.mark.timeout(600)
_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


def differences(registry: RunningRegistry, pair: Pair) -> list[str]:
    """Where the decoder's columns differ from the specification's reading, or the deserializer's
    from it where the case does not say that it departs."""
    topic = unique("avro_diff")
    context = SerializationContext(topic, MessageField.VALUE)
    write = AvroSerializer(registry.client(), json.dumps(pair.writer))
    values = [write(r, context) for r in pair.records]

    fields = spark_type(fastavro.parse_schema(copy.deepcopy(pair.reader)))
    decoder = Decoder(Registry.of(registry.url), AvroValues(pair.reader), fields, ("value",))
    batch = pa.RecordBatch.from_arrays([pa.array(values, pa.binary())], names=["value"])
    decoded = pa.Table.from_batches(list(decoder(iter([batch]))))
    deserialize = AvroDeserializer(registry.client(), json.dumps(pair.reader))
    by_reader = {f.reader["name"]: f for f in pair.fields if f.reader is not None}

    found = []
    for i, (record, value) in enumerate(zip(pair.records, values, strict=True)):
        if decoded.column("_error")[i].as_py() is not None:
            found.append(f"record {i}: {decoded.column('_error')[i].as_py()}")
            continue
        want = pair.read(record)
        theirs = deserialize(value, context)
        for column in fields:
            conv = converter(column.dataType) or (lambda v: v)
            field: Field = by_reader[column.name]
            expected = conv(field.column(want[column.name]))
            got = decoded.column(column.name)[i].as_py()
            if got != expected:
                found.append(
                    f"record {i} {column.name}: decoded {got!r}, the specification reads {expected!r}"
                )
            if field.departs is not None:  # the specification wins: theirs is not held to it
                continue
            if _as_column(column, conv(field.column(theirs[column.name]))) != expected:
                found.append(
                    f"record {i} {column.name}: AvroDeserializer gives {theirs[column.name]!r},"
                    f" the specification reads {expected!r}"
                )
    return found


def _as_column(column: T.StructField, value: Any) -> Any:
    """A value as its column's type holds it (a Python float as a float's 32 bits)."""
    return pa.array([value], to_arrow_type(column.dataType, timezone="UTC"))[0].as_py()


def check(registry: RunningRegistry, pair: Pair) -> None:
    found = differences(registry, pair)
    assert not found, (json.dumps(pair.writer), json.dumps(pair.reader, default=str), found)


@settings(max_examples=40, deadline=None, suppress_health_check=_FIXTURES)
@given(pairs())
def test_each_pair_reads_as_the_specification_and_as_confluents_deserializer_read_it(
    registry: RunningRegistry, pair: Pair
) -> None:
    check(registry, pair)


@pytest.mark.soak
@settings(max_examples=1500, deadline=None, suppress_health_check=_FIXTURES)
@given(pairs(max_fields=8, max_records=5))
def test_many_pairs_read_as_the_specification_and_as_confluents_deserializer_read_them(
    registry: RunningRegistry, pair: Pair
) -> None:
    check(registry, pair)


def _one(
    name: str, writer: Any, reader: dict[str, Any] | None, read: Any, departs: str | None = None
) -> Field:
    declared = {"name": name, "type": writer} if writer else None
    return Field(declared, reader, st.nothing(), lambda _: read, departs)


def _pair(*fields: tuple[Field, Any]) -> Pair:
    return Pair(
        {
            "type": "record",
            "name": "Case",
            "doc": unique("d"),
            "fields": [f.writer for f, _ in fields if f.writer],
        },
        {"type": "record", "name": "Case", "fields": [f.reader for f, _ in fields if f.reader]},
        tuple(f for f, _ in fields),
        ({f.writer["name"]: v for f, v in fields if f.writer},),
    )


@pytest.mark.parametrize(
    ("kind", "default"),
    [
        ("bytes", b"\xff\x00"),
        ("fixed", b"\x00\xff\x7f\x80"),
        ("decimal", Decimal("-1.05")),
        ("fixed-decimal", Decimal("12345.678")),
        ("timestamp-millis", dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)),
        ("time-millis", dt.time(0, 0, 1)),
        ("date", dt.date(2026, 12, 2)),
        ("uuid", "0b6c53c1-8f7b-4c8e-9d41-3c5a3e0e1f2a"),
        ("record", {"x": -7, "s": "é"}),
    ],
)
def test_a_default_of_each_kind_is_read_as_the_value_it_stands_for(
    registry: RunningRegistry, kind: str, default: Any
) -> None:
    """Each default alone: `\\u00ff` is the byte 0xff, a decimal's default its two's complement,
    a timestamp-millis default milliseconds, a time-millis default a time."""
    reader = {"name": "added", "type": KINDS[kind].schema, "default": KINDS[kind].as_json(default)}
    kept = _one("n", "long", {"name": "n", "type": "long"}, 1)
    departs = "a default as raw JSON" if kind in RAW_DEFAULT else None
    check(registry, _pair((kept, 1), (_one("added", None, reader, default, departs), None)))


AT = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
LONG_AS_INSTANT = Field(
    {"name": "at", "type": "long"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    st.just(1_700_000_000_000),
    lambda _: AT,
    "the writer's logical type only",
)
BYTES_DEFAULT = _one("b", None, {"name": "b", "type": "bytes", "default": "\u00ff"}, b"\xff", "raw JSON")


def test_a_writers_long_read_as_a_readers_timestamp_millis_is_that_instant(registry: RunningRegistry) -> None:
    check(registry, _pair((LONG_AS_INSTANT, 1_700_000_000_000)))


def test_a_planted_decode_bug_is_found(registry: RunningRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The differential is able to fail: with fastavro's raw defaults, the writer's logical types and
    a union's member as plain text (the corrections taken out), the cases above differ."""
    monkeypatch.setattr(avro_resolve, "with_defaults", copy.deepcopy)
    monkeypatch.setattr(avro_resolve, "aligned", lambda writer, reader: writer)
    monkeypatch.setattr(avro, "unions_as_json", lambda schema, named: None)
    kept = _one("n", "long", {"name": "n", "type": "long"}, 1)
    raw_default = differences(registry, _pair((kept, 1), (BYTES_DEFAULT, None)))
    assert raw_default == ["record 0 b: decoded b'\\xc3\\xbf', the specification reads b'\\xff'"], raw_default
    writers_type = differences(registry, _pair((LONG_AS_INSTANT, 1_700_000_000_000)))
    # Arrow takes the raw long as microseconds: the instant the issue saw, 1970-01-20T16:13:20Z.
    assert len(writers_type) == 1 and "decoded datetime.datetime(1970, 1, 20, 16, 13, 20" in writers_type[0]
    union = Field(
        {"name": "u", "type": ["int", "string"]},
        {"name": "u", "type": ["string", "int"]},
        st.nothing(),
        lambda v: v,
        column=lambda v: json.dumps(v),
    )
    as_text = differences(registry, _pair((union, "5")))
    assert as_text == ["record 0 u: decoded '5', the specification reads '\"5\"'"], as_text
