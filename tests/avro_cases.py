"""Avro writer/reader schema pairs a registry accepts, with values and what Avro's resolution reads.

A pair is a record of fields, each drawn as one evolution of one type: kept,
promoted (int to long, float to double, string to bytes, ...), given or
stripped of a logical type (a `long` read as `timestamp-millis`), renamed
through an alias, dropped by the reader, or added by the reader with a default
of its type. Each field knows the value Avro's specification reads (as Avro's
Java implementation does), from the value the writer wrote or from the
default's own value, never from a decoder: the default's JSON is made from
that value by the specification's rules. Where fastavro (under
confluent-kafka's AvroDeserializer) reads something else, the field says why
in `departs`.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hypothesis import strategies as st

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_UTC_RANGE = {
    "min_value": dt.datetime(1900, 1, 1),
    "max_value": dt.datetime(2200, 1, 1),
}


def _millis(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


@dataclass(frozen=True)
class Kind:
    """A type: its schema, values the writer may hold, and each value's JSON as a default."""

    schema: Any
    values: st.SearchStrategy[Any]
    as_json: Callable[[Any], Any] = lambda v: v


def _unscaled(value: Decimal, scale: int, size: int | None = None) -> str:
    unscaled = int(value.scaleb(scale))
    length = size or max(1, (unscaled.bit_length() + 8) // 8)
    return unscaled.to_bytes(length, "big", signed=True).decode("latin-1")


def _ms(value: dt.datetime) -> int:
    zoned = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return (zoned - EPOCH) // dt.timedelta(milliseconds=1)


def _us(value: dt.datetime) -> int:
    zoned = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return (zoned - EPOCH) // dt.timedelta(microseconds=1)


def _day_us(value: dt.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


_utc = st.datetimes(**_UTC_RANGE, timezones=st.just(dt.UTC))
_naive = st.datetimes(**_UTC_RANGE)
_text = st.text(max_size=6)
KINDS: dict[str, Kind] = {
    "boolean": Kind("boolean", st.booleans()),
    "int": Kind("int", st.integers(-(2**31), 2**31 - 1)),
    "long": Kind("long", st.integers(-(2**63), 2**63 - 1)),
    "float": Kind("float", st.floats(width=32, allow_nan=False, allow_infinity=False)),
    "double": Kind("double", st.floats(allow_nan=False, allow_infinity=False)),
    "string": Kind("string", _text),
    "bytes": Kind("bytes", st.binary(max_size=6), lambda v: v.decode("latin-1")),
    "decimal": Kind(
        {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        st.decimals(min_value=-9999999, max_value=9999999, places=2),
        lambda v: _unscaled(v, 2),
    ),
    "fixed-decimal": Kind(
        {"type": "fixed", "name": "Money", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3},
        st.decimals(min_value=-999999999, max_value=999999999, places=3),
        lambda v: _unscaled(v, 3, 8),
    ),
    "fixed": Kind(
        {"type": "fixed", "name": "Four", "size": 4},
        st.binary(min_size=4, max_size=4),
        lambda v: v.decode("latin-1"),
    ),
    "date": Kind(
        {"type": "int", "logicalType": "date"},
        st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1)),
        lambda v: (v - dt.date(1970, 1, 1)).days,
    ),
    "time-millis": Kind(
        {"type": "int", "logicalType": "time-millis"},
        st.times().map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
        lambda v: _day_us(v) // 1000,
    ),
    "time-micros": Kind({"type": "long", "logicalType": "time-micros"}, st.times(), _day_us),
    "timestamp-millis": Kind({"type": "long", "logicalType": "timestamp-millis"}, _utc.map(_millis), _ms),
    "timestamp-micros": Kind({"type": "long", "logicalType": "timestamp-micros"}, _utc, _us),
    "local-timestamp-millis": Kind(
        {"type": "long", "logicalType": "local-timestamp-millis"}, _naive.map(_millis), _ms
    ),
    "local-timestamp-micros": Kind({"type": "long", "logicalType": "local-timestamp-micros"}, _naive, _us),
    "uuid": Kind({"type": "string", "logicalType": "uuid"}, st.uuids().map(str)),
    "enum": Kind(
        {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}, st.sampled_from(["RED", "GREEN"])
    ),
    "array": Kind({"type": "array", "items": "long"}, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
    "map": Kind({"type": "map", "values": "string"}, st.dictionaries(_text, _text, max_size=3)),
    "record": Kind(
        {
            "type": "record",
            "name": "Inner",
            "fields": [{"name": "x", "type": "int"}, {"name": "s", "type": "string"}],
        },
        st.fixed_dictionaries({"x": st.integers(-(2**31), 2**31 - 1), "s": _text}),
    ),
}
# Kinds a reader may add with a default where fastavro gives the default's JSON as it stands.
RAW_DEFAULT = {"bytes", "decimal", "fixed-decimal", "fixed", "date", "time-millis", "time-micros"} | {
    k for k in KINDS if "timestamp" in k
}


@dataclass(frozen=True)
class Field:
    """One field of a pair: the writer's and the reader's declarations (None: it has none)."""

    writer: dict[str, Any] | None
    reader: dict[str, Any] | None
    values: st.SearchStrategy[Any]  # what the writer writes
    read: Callable[[Any], Any]  # what the specification reads of a written value, or the default
    departs: str | None = None  # why fastavro reads something else, if it does
    column: Callable[[Any], Any] = lambda v: v  # how the sink's column holds a value read, by docs/sink.md


def _named(kind: str, name: str) -> Any:
    """The kind's schema, its named types given names of this field's own."""
    schema = KINDS[kind].schema
    if isinstance(schema, dict) and "name" in schema:
        return {**schema, "name": f"{schema['name']}_{name}"}
    return schema


def _json(value: Any) -> str | None:
    """A union's member as its column holds it: its JSON (bytes in base64, as Spark's to_json)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return json.dumps(base64.b64encode(value).decode())
    return json.dumps(value, separators=(",", ":"))


def _unions(name: str) -> list[st.SearchStrategy[Field]]:
    """Unions of several types, reordered or given a branch by the reader: each value keeps its
    member's type in its JSON, so the int 5 and the string "5" stay apart."""

    def union(writer: Any, reader: Any, values: st.SearchStrategy[Any], column: Any = _json) -> Any:
        declared = ({"name": name, "type": writer}, {"name": name, "type": reader})
        return st.just(Field(*declared, values, lambda v: v, column=column))

    inner = {"type": "record", "name": f"U_{name}", "fields": [{"name": "x", "type": "int"}]}
    return [
        union(["int", "string"], ["string", "int"], _INT | _text),
        union(["null", "long", "string"], ["null", "string", "long", "bytes"], st.none() | _LONG | _text),
        union(["null", "string", inner], ["null", "string", inner], st.none() | _text | _RECORD_X),
        # Not a reader's union of string and bytes (or int and long) with a writer's of both:
        # fastavro reads into the first that the writer's promotes to, Avro's Java into the exact.
        union(
            {"type": "array", "items": ["int", "bytes"]},
            {"type": "array", "items": ["bytes", "boolean", "int"]},
            st.lists(_INT | st.binary(max_size=4), max_size=3),
            lambda v: None if v is None else [_json(x) for x in v],
        ),
    ]


_RECORD_X = st.fixed_dictionaries({"x": st.integers(-(2**31), 2**31 - 1)})


def _changed(
    name: str,
    writer: Any,
    reader: Any,
    values: st.SearchStrategy[Any],
    read: Callable[[Any], Any],
    departs: str | None = None,
) -> Field:
    return Field({"name": name, "type": writer}, {"name": name, "type": reader}, values, read, departs)


_INT = st.integers(-(2**31), 2**31 - 1)
_LONG = st.integers(-(2**63), 2**63 - 1)
_MS = st.integers(_ms(dt.datetime(1900, 1, 1, tzinfo=dt.UTC)), _ms(dt.datetime(2200, 1, 1, tzinfo=dt.UTC)))
_DAYS = st.integers(-25567, 84006)  # 1900 to 2200


def _evolutions(name: str) -> list[st.SearchStrategy[Field]]:
    ts = {"type": "long", "logicalType": "timestamp-millis"}
    return [
        st.sampled_from(sorted(KINDS)).map(
            lambda k: Field(
                {"name": name, "type": _named(k, name)},
                {"name": name, "type": _named(k, name)},
                KINDS[k].values,
                lambda v: v,
            )
        ),
        st.sampled_from(sorted(KINDS)).map(
            lambda k: Field(
                {"name": name, "type": ["null", _named(k, name)]},
                {"name": name, "type": ["null", _named(k, name)]},
                st.none() | KINDS[k].values,
                lambda v: v,
            )
        ),
        st.just(_changed(name, "int", "long", _INT, lambda v: v)),
        st.just(_changed(name, "int", "double", _INT, float)),
        st.just(_changed(name, "int", "float", _INT, _float32)),
        st.just(_changed(name, "long", "double", _LONG, float)),
        st.just(_changed(name, "float", "double", KINDS["float"].values, lambda v: v)),
        st.just(_changed(name, "string", "bytes", _text, lambda v: v.encode())),
        st.just(_changed(name, "bytes", "string", _text.map(str.encode), lambda v: v.decode())),
        st.just(
            _changed(
                name,
                "long",
                ts,
                _MS,
                lambda v: EPOCH + dt.timedelta(milliseconds=v),
                "the writer's logical type only",
            )
        ),
        st.just(
            _changed(
                name,
                "long",
                {"type": "long", "logicalType": "local-timestamp-micros"},
                _MS,
                lambda v: dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=v),
                "the writer's logical type only",
            )
        ),
        st.just(
            _changed(
                name,
                "int",
                {"type": "int", "logicalType": "date"},
                _DAYS,
                lambda v: dt.date(1970, 1, 1) + dt.timedelta(days=v),
                "the writer's logical type only",
            )
        ),
        st.just(
            _changed(
                name,
                "int",
                ts,
                st.integers(0, 2**31 - 1),
                lambda v: EPOCH + dt.timedelta(milliseconds=v),
                "the writer's logical type only",
            )
        ),
        st.just(_changed(name, ts, "long", _utc.map(_millis), _ms, "the writer's logical type only")),
        st.just(
            _changed(
                name,
                {"type": "enum", "name": f"E_{name}", "symbols": ["A", "B"]},
                {"type": "enum", "name": f"E_{name}", "symbols": ["A", "B", "C"]},
                st.sampled_from(["A", "B"]),
                lambda v: v,
            )
        ),
        st.just(
            Field(
                {"name": name, "type": "long"},
                {"name": f"{name}_renamed", "type": "long", "aliases": [name]},
                _LONG,
                lambda v: v,
            )
        ),
        st.just(Field({"name": name, "type": "string"}, None, _text, lambda v: v)),
        st.sampled_from(sorted(KINDS)).flatmap(lambda k: _added(name, k)),
        *_unions(name),
    ]


def _added(name: str, kind: str) -> st.SearchStrategy[Field]:
    """A field the reader adds with a default of the kind: the default's value drawn first."""

    def field(default: Any) -> Field:
        reader = {"name": name, "type": _named(kind, name), "default": KINDS[kind].as_json(default)}
        departs = "a default as raw JSON" if kind in RAW_DEFAULT else None
        return Field(None, reader, st.none(), lambda _: default, departs)

    return KINDS[kind].values.map(field)


@dataclass(frozen=True)
class Pair:
    writer: dict[str, Any]
    reader: dict[str, Any]
    fields: tuple[Field, ...]
    records: tuple[dict[str, Any], ...]  # written by the writer

    def read(self, record: dict[str, Any]) -> dict[str, Any]:
        """What the specification reads of a written record, by reader field."""
        out = {}
        for f in self.fields:
            if f.reader is not None:
                out[f.reader["name"]] = f.read(record.get(f.writer["name"]) if f.writer else None)
        return out


@st.composite
def pairs(draw: st.DrawFn, max_fields: int = 5, max_records: int = 3) -> Pair:
    count = draw(st.integers(1, max_fields))
    # A field both keep first: confluent-kafka's deserializer refuses a value of no body at all (a
    # record of no fields), which Avro and our decoder read.
    kept = Field({"name": "id", "type": "long"}, {"name": "id", "type": "long"}, _LONG, lambda v: v)
    fields = (kept, *(draw(st.one_of(_evolutions(f"f{i}"))) for i in range(count)))
    doc = uuid.uuid4().hex  # a schema of its own: a registry gives one id to one content
    writer = {"type": "record", "name": "Case", "doc": doc, "fields": [f.writer for f in fields if f.writer]}
    reader = {"type": "record", "name": "Case", "fields": [f.reader for f in fields if f.reader]}
    written = [f for f in fields if f.writer]
    records = draw(
        st.lists(
            st.fixed_dictionaries({f.writer["name"]: f.values for f in written}),  # type: ignore[index]
            min_size=1,
            max_size=max_records,
        )
    )
    return Pair(writer, reader, fields, tuple(records))
