"""Framed values decoded in bulk into a frame's columns, in the Python workers (mapInArrow).

Each format (avro.py, protobuf.py) reads a batch's values into records, one
dict of Python values each, and says why for each value it cannot read; this
makes them the reader's columns, passes the Kafka columns through, and puts
each reason in `_error`, which the sink dead-letters.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from outbox.core.registry import Registry
from sinks.postgres.plan import ERROR_COLUMN

Convert = Callable[[Any], Any]
# A batch's values (None: a tombstone) -> each one's record (None where there is none) and error.
Read = Callable[[list[bytes | None]], tuple[list[dict[str, Any] | None], list[str | None]]]


class Values(Protocol):
    """A format's reader schema, picklable: what the values are read into."""

    def reader_in(self, registry: Registry) -> Read: ...


def converter(kind: T.DataType) -> Convert | None:
    """What makes a decoded value of a field into the value Arrow takes for `kind` (None: as is).

    Only text from values that are not text (a uuid, a time), maps, which Arrow
    takes as pairs, and integers into decimals (Protobuf's uint64) need one."""
    if isinstance(kind, T.StringType):
        return _text
    if isinstance(kind, T.DecimalType):
        return lambda v: Decimal(v) if isinstance(v, int) else v
    if isinstance(kind, T.StructType):
        inner = {f.name: c for f in kind.fields if (c := converter(f.dataType)) is not None}
        if not inner:
            return None
        return lambda v: v if v is None else {k: (inner[k](x) if k in inner else x) for k, x in v.items()}
    if isinstance(kind, T.ArrayType):
        item = converter(kind.elementType)
        return None if item is None else (lambda v: v if v is None else [item(x) for x in v])
    if isinstance(kind, T.MapType):
        value = converter(kind.valueType) or (lambda x: x)
        return lambda v: v if v is None else [(k, value(x)) for k, x in v.items()]
    return None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list | bool | int | float):
        return as_json(value)
    return _json(value)


def as_json(value: Any) -> str | None:
    """A value as JSON text (None stays None): what keeps a union's member's type in text."""
    return None if value is None else json.dumps(value, default=_json, separators=(",", ":"))


def _json(value: Any) -> str:
    """A value JSON has no type for as text: bytes in base64 (as Spark's to_json writes binary),
    times and dates in ISO 8601, the rest (a decimal, a UUID) as its own text; never a repr."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


@dataclass(frozen=True)
class Decoder:
    """What a Python worker needs to decode a frame's values: pickled to the executors."""

    registry: Registry
    values: Values  # what the values are read into: the reader schema, by format
    fields: T.StructType  # the reader's fields as Spark types
    keep: tuple[str, ...]  # the Kafka columns passed through
    keys: Values | None = None  # what a tombstone's Kafka key is read into: its key column

    def out_schema(self) -> T.StructType:
        return T.StructType(
            [*self.fields.fields, *_kept(self.keep), T.StructField(ERROR_COLUMN, T.StringType())]
        )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        out = self.out_schema()
        arrow = pa.schema([pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in out.fields])
        read = self.values.reader_in(self.registry)
        read_keys = self.keys.reader_in(self.registry) if self.keys else None
        convert = [converter(f.dataType) for f in self.fields.fields]
        for batch in batches:
            values = batch.column("value").to_pylist()
            records, errors = read(values)
            tombstones = [i for i, v in enumerate(values) if v is None] if read_keys else []
            if read_keys is not None and tombstones:  # each tombstone's key column from its key
                keys = batch.column("key").to_pylist()
                keyed = read_keys([keys[i] for i in tombstones])
                for i, record, why in zip(tombstones, *keyed, strict=True):
                    records[i], errors[i] = record, why
            columns = []
            for f, conv, kind in zip(self.fields.fields, convert, arrow, strict=False):
                got = [None if r is None else r.get(f.name) for r in records]
                columns.append(_column(f, got if conv is None else [conv(v) for v in got], kind, errors))
            kept = [batch.column(name) for name in self.keep]
            yield pa.RecordBatch.from_arrays([*columns, *kept, pa.array(errors, pa.string())], schema=arrow)


def _column(field: T.StructField, values: list[Any], kind: pa.Field, errors: list[str | None]) -> pa.Array:
    """The field's values as Arrow. A value Arrow cannot hold as the field's type fails its record
    alone (its error set, its value NULL), not the batch, which Spark would retry for ever."""
    try:
        return pa.array(values, kind.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
        held: list[Any] = []
        for i, value in enumerate(values):
            try:
                pa.array([value], kind.type)
                held.append(value)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
                held.append(None)
                errors[i] = (
                    errors[i] or f"field {field.name!r}: its value is no {field.dataType.simpleString()}"
                )
        return pa.array(held, kind.type)


_KAFKA_TYPES = {
    "key": T.BinaryType(),
    "value": T.BinaryType(),
    "topic": T.StringType(),
    "partition": T.IntegerType(),
    "offset": T.LongType(),
    "headers": T.ArrayType(
        T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
    ),
}


def _kept(keep: tuple[str, ...]) -> list[T.StructField]:
    return [T.StructField(name, _KAFKA_TYPES[name]) for name in keep]
