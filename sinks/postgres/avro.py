"""Avro values in Confluent's wire format, decoded in bulk into the columns of a reader schema.

A framed value is a zero byte, the writer schema's id (4 bytes, big-endian)
and the Avro body. Each value is read with its writer schema, from the
registry by id, and resolved to the reader schema by Avro's rules (fastavro),
so a topic whose schema evolves (fields added with defaults, removed) keeps
flowing into one table; where fastavro's resolution departs from Avro's own,
avro_resolve.py corrects it once per schema. A value that cannot be read gets its reason in the
`_error` column, and the sink dead-letters it; the rest of the batch goes on.

`spark_type` is the reader schema's Spark type, decided once on the driver:
logical types keep their meaning (decimal, date, timestamps with and without
a zone); those Spark has no type for (time, uuid) are text, which PostgreSQL
parses into its own column types. A union of several types is its member's
JSON (a string quoted), so a `jsonb` column keeps the int 5 apart from the
string "5".
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from outbox.core.errors import OutboxError
from outbox.core.registry import Registry, Settings, UnknownSchema
from outbox.core.wire import framed
from sinks.errors import error
from sinks.postgres.decoded import Convert, Read, as_json

AvroSchema = Any  # fastavro's parsed schema: a name, a dict, or a list (a union)

_PRIMITIVE: dict[str, T.DataType] = {
    "boolean": T.BooleanType(),
    "int": T.IntegerType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "double": T.DoubleType(),
    "bytes": T.BinaryType(),
    "string": T.StringType(),
}
# A logical type on another type than these is ignored, as the specification says.
_LOGICAL: dict[tuple[str, str], T.DataType] = {
    ("int", "date"): T.DateType(),
    ("long", "timestamp-millis"): T.TimestampType(),
    ("long", "timestamp-micros"): T.TimestampType(),
    ("long", "local-timestamp-millis"): T.TimestampNTZType(),
    ("long", "local-timestamp-micros"): T.TimestampNTZType(),
    ("int", "time-millis"): T.StringType(),
    ("long", "time-micros"): T.StringType(),
    ("string", "uuid"): T.StringType(),
}
_MAX_PRECISION = 38  # Spark's decimals; a wider one is text


def spark_type(schema: AvroSchema, named: dict[str, Any] | None = None) -> T.DataType:
    """The Spark type of an Avro schema parsed by fastavro (`named`: its named types)."""
    named = schema.get("__named_schemas", {}) if named is None and isinstance(schema, dict) else named or {}
    return _spark(schema, named, ())


def _spark(schema: AvroSchema, named: dict[str, Any], open_records: tuple[str, ...]) -> T.DataType:
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        return _spark(others[0], named, open_records) if len(others) == 1 else T.StringType()
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            return _PRIMITIVE[schema]
        if schema == "null":
            return T.NullType()
        return _spark(named[schema], named, open_records)
    kind, logical = schema["type"], schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return T.DecimalType(precision, scale) if precision <= _MAX_PRECISION else T.StringType()
    if (kind, logical) in _LOGICAL:
        return _LOGICAL[kind, logical]
    if kind == "record" or kind == "error":
        if schema["name"] in open_records:  # a record that holds itself: its JSON text
            return T.StringType()
        inner = (*open_records, schema["name"])
        return T.StructType(
            [T.StructField(f["name"], _spark(f["type"], named, inner)) for f in schema["fields"]]
        )
    if kind == "enum":
        return T.StringType()
    if kind == "fixed":
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_spark(schema["items"], named, open_records))
    if kind == "map":
        return T.MapType(T.StringType(), _spark(schema["values"], named, open_records))
    return _spark(kind, named, open_records)  # {"type": "long"} and the like


def unions_as_json(
    schema: AvroSchema, named: dict[str, Any], open_records: tuple[str, ...] = ()
) -> Convert | None:
    """What makes each value of a union of several types in a decoded datum its JSON text, as
    `spark_type` gives such a union text (None: the schema holds none). A record that holds
    itself is JSON text as a whole, which keeps its members' types already."""
    if isinstance(schema, list):
        others = [s for s in schema if s != "null"]
        if len(others) > 1:
            return as_json
        return unions_as_json(others[0], named, open_records) if others else None
    if isinstance(schema, str):
        found = named.get(schema)
        return None if found is None else unions_as_json(found, named, open_records)
    kind = schema["type"]
    if kind == "record" or kind == "error":
        if schema["name"] in open_records:
            return None
        inner_records = (*open_records, schema["name"])
        inner = {
            f["name"]: c for f in schema["fields"] if (c := unions_as_json(f["type"], named, inner_records))
        }
        if not inner:
            return None
        return lambda v: v if v is None else {k: (inner[k](x) if k in inner else x) for k, x in v.items()}
    if kind == "array":
        item = unions_as_json(schema["items"], named, open_records)
        return None if item is None else (lambda v: v if v is None else [item(x) for x in v])
    if kind == "map":
        value = unions_as_json(schema["values"], named, open_records)
        return None if value is None else (lambda v: v if v is None else {k: value(x) for k, x in v.items()})
    return unions_as_json(kind, named, open_records) if isinstance(kind, dict | list) else None


@dataclass(frozen=True)
class AvroValues:
    """The reader schema, as JSON: what a Python worker reads values into (decoded.Decoder)."""

    reader: dict[str, Any]

    def reader_in(self, registry: Registry) -> Read:
        return _Schemas(registry, self.reader).decode


class _Schemas:
    """Writer schemas by id for one task, parsed once each per Python worker."""

    def __init__(self, registry: Registry, reader: dict[str, Any]) -> None:
        import fastavro

        from sinks.postgres import avro_resolve

        self.registry = registry
        parsed = fastavro.parse_schema(reader)
        self.same = json.dumps(parsed, sort_keys=True)
        self.reader = avro_resolve.with_defaults(parsed)
        named = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}
        self.unions = unions_as_json(parsed, named)

    def decode(self, values: list[bytes | None]) -> tuple[list[dict[str, Any] | None], list[str | None]]:
        """Each value's record (None for a tombstone or an error), and each one's error."""
        import fastavro

        records: list[dict[str, Any] | None] = []
        errors: list[str | None] = []
        for value in values:
            if value is None:
                records.append(None)
                errors.append(None)
                continue
            got = framed(value)
            if isinstance(got, str):
                records.append(None)
                errors.append(got)
                continue
            schema_id, body = got
            writer = _writer(self.registry, schema_id, self.reader, self.same)
            if isinstance(writer, str):
                records.append(None)
                errors.append(writer)
                continue
            buffer = io.BytesIO(body)
            try:
                record = fastavro.schemaless_reader(buffer, *writer)
            except (EOFError, IndexError):  # fastavro's for a body that ends early
                records.append(None)
                errors.append(
                    f"the value ends inside its record of writer schema id {schema_id}: it is cut short"
                )
                continue
            except Exception as exc:  # fastavro's: ValueError, SchemaResolutionError, ...
                records.append(None)
                errors.append(
                    f"the value does not decode as Avro of writer schema id {schema_id}: {_said(exc)}"
                )
                continue
            if buffer.tell() != len(body):
                records.append(None)
                errors.append(
                    f"the value holds {len(body) - buffer.tell()} bytes past its record of writer schema id"
                    f" {schema_id}"
                )
                continue
            if not isinstance(record, dict):
                record = None
            elif self.unions is not None:
                record = self.unions(record)
            records.append(record)
            errors.append(None)
        return records, errors


@dataclass(frozen=True)
class AvroKeys:
    """How a tombstone's Kafka key in Confluent's wire format (Confluent's key serializer) gives
    its key column: read with its own writer schema, the key itself, or its record's field of the
    column's name, as Confluent's AvroDeserializer reads it."""

    key_column: str

    def reader_in(self, registry: Registry) -> Read:
        return lambda keys: _keys(registry, self.key_column, keys)


def _keys(
    registry: Registry, column: str, keys: list[bytes | None]
) -> tuple[list[dict[str, Any] | None], list[str | None]]:
    """Each key's record of the one key column, or why the key gives none."""
    records: list[dict[str, Any] | None] = []
    errors: list[str | None] = []
    for key in keys:
        found = "a tombstone with no key deletes nothing" if key is None else framed(key)
        got: tuple[Any] | str
        if isinstance(found, str):
            got = found
        else:
            schema_id, body = found
            writer = _writer(registry, schema_id, None, "")
            got = writer if isinstance(writer, str) else _key_of(writer, schema_id, body, column)
        if isinstance(got, str):
            records.append(None)
            errors.append(f"the Kafka key of this tombstone: {got}")
        else:
            records.append({column: got[0]})
            errors.append(None)
    return records, errors


def _key_of(writer: tuple[Any, Any], schema_id: int, body: memoryview, column: str) -> tuple[Any] | str:
    """The key column's value in one key (a 1-tuple: the value may be None), or why none."""
    import fastavro

    buffer = io.BytesIO(body)
    try:
        datum = fastavro.schemaless_reader(buffer, *writer)
    except Exception as exc:  # fastavro's: EOFError, ValueError, ...
        return f"it does not decode as Avro of writer schema id {schema_id}: {_said(exc)}"
    if buffer.tell() != len(body):
        return f"it holds {len(body) - buffer.tell()} bytes past its datum of writer schema id {schema_id}"
    if not isinstance(datum, dict):
        return (datum,)
    if column not in datum:
        return f"its record of writer schema id {schema_id} has no field {column!r}"
    return (datum[column],)


# Per Python worker: (registry, schema id, reader) -> (writer, reader or None), or why not.
_writers: dict[tuple[Settings, int, str], tuple[Any, Any] | str | OutboxError] = {}


def _writer(registry: Registry, schema_id: int, reader: Any, same: str) -> tuple[Any, Any] | str:
    """The writer schema of an id and the reader to resolve it to, or why its records are dead
    letters; raises where no record of it can be read as the reader (a schema change)."""
    key = (registry.key, schema_id, same)
    found = _writers.get(key)
    if found is None:
        found = _writers[key] = _fetch_writer(registry, schema_id, reader, same)
    if isinstance(found, OutboxError):
        raise found
    return found


def _fetch_writer(
    registry: Registry, schema_id: int, reader: Any, same: str
) -> tuple[Any, Any] | str | OutboxError:
    """The writer schema of an id and the reader to resolve it to, or why the id has none. Only
    the registry's answers are kept: a registry that fails to answer raises, and is asked again."""
    import fastavro

    from sinks.postgres import avro_resolve

    try:
        schema = registry.schema(schema_id)
    except UnknownSchema:
        return f"schema id {schema_id} is not known to the schema registry at {registry.where}"
    if (schema.schema_type or "AVRO") != "AVRO":
        return f"schema id {schema_id} is a {schema.schema_type} schema, not Avro"
    references = _references(registry, schema)
    try:
        named: dict[str, Any] = {}
        for ref in references:
            fastavro.parse_schema(json.loads(ref), named_schemas=named)
        writer = fastavro.parse_schema(json.loads(schema.schema_str), named_schemas=named)
    except Exception as exc:
        return f"schema id {schema_id} is not an Avro schema fastavro reads: {_said(exc)}"
    # Read with the writer schema alone where it is the reader's (or there is no reader: a key).
    if reader is None or json.dumps(writer, sort_keys=True) == same:
        return avro_resolve.aligned(writer, writer), None
    if lacking := avro_resolve.lacking(writer, reader):
        return error("SINK_AVRO_WRITER_UNREADABLE", schema_id=schema_id, fields=", ".join(lacking))
    return avro_resolve.aligned(writer, reader), reader


def _references(registry: Registry, schema: Any, seen: frozenset[tuple[str, int]] = frozenset()) -> list[str]:
    """The texts of the schemas it references, those they reference first."""
    texts: list[str] = []
    for ref in schema.references or []:
        at = (ref.subject, ref.version)
        if at in seen:
            continue
        referenced = registry.version(ref.subject, ref.version).schema
        texts += [*_references(registry, referenced, seen | {at}), referenced.schema_str]
    return texts


def _said(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
