"""From a Kafka source frame to event columns (JSON, Avro, Protobuf), keeping what the sink needs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, get_args

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from outbox.core.registry import Registry, UnknownSchema
from sinks.errors import error
from sinks.postgres import avro, protobuf
from sinks.postgres.decoded import Decoder
from sinks.postgres.direct import Parsed, remember
from sinks.postgres.plan import ERROR_COLUMN
from sinks.postgres.spark_plan import read_plan

KEEP = ("key", "value", "topic", "partition", "offset")


def _keep(frame: DataFrame, event: T.StructType) -> tuple[str, ...]:
    """KEEP, and Kafka's headers where the source gives them and no field of the events is so
    named: a routed sink may pick tables by one (routing.header)."""
    headers = "headers" in frame.columns and "headers" not in event.fieldNames()
    return (*KEEP, "headers") if headers else KEEP


KeyFormat = Literal["text", "json"]  # how a tombstone's Kafka key is read
RegistryKeyFormat = Literal["text", "json", "avro"]  # "avro": framed, as Confluent's key serializer
_KEY_FORMATS: tuple[str, ...] = get_args(KeyFormat)
_CORRUPT = "_corrupt_record"


def parse_json(
    frame: DataFrame,
    schema: str | T.StructType,
    *,
    key_column: str | None = None,
    key_format: KeyFormat = "text",
    options: dict[str, Any] | None = None,
) -> DataFrame:
    """Parse the Kafka value as JSON into the schema's columns.

    Keeps the raw key and value (for tombstones and dead letters) and the
    position (topic, partition, offset) that makes the sink exactly-once.
    In a tombstone (null value) `key_column` comes from the Kafka key, so the
    sink knows which row to delete: the key's text (`key_format="text"`), or
    (`"json"`, as Kafka Connect's JsonConverter and Debezium write keys) a JSON
    string or number, or the field `key_column` of a JSON object, also inside
    Connect's {"schema": ..., "payload": {...}} envelope.

    A top-level field that is present but cannot be read as its type
    (`"amount": "not-a-number"` for a decimal) never becomes NULL: the row gets
    an error in the `_error` column, and the sink dead-letters it.
    """
    event = _struct(frame, schema)
    _check_fields(event, key_column, key_format)
    text = F.col("value").cast("string")
    # PERMISSIVE parsing keeps the fields it could read and, when any field (or the
    # whole value) could not be, the record's text in the corrupt-record column:
    # one parse for every row, a second one only for the rare bad row, to say why.
    with_corrupt = T.StructType([*event.fields, T.StructField(_CORRUPT, T.StringType())])
    parse_options = {**(options or {}), "mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    keep = _keep(frame, event)
    parsed = frame.select(F.from_json(text, with_corrupt, parse_options).alias("_event"), *keep)

    # A tombstone's key column is its Kafka key, read as the column's type: try_cast, for under ANSI
    # mode (Spark's default) a key that does not read (Java's LongSerializer's 8 bytes for a bigint)
    # failed the task, and every replay of the batch; it is a dead letter instead.
    tombstone = F.col("value").isNull()
    key = _tombstone_key(event[key_column], key_format) if key_column else None

    def field(f: T.StructField) -> Column:
        column = F.col("_event").getField(f.name)
        if f.name == key_column:
            column = F.when(tombstone, key).otherwise(column)
        return column.alias(f.name)

    corrupt = F.col("_event").getField(_CORRUPT)
    unreadable = F.when(corrupt.isNotNull(), _unreadable_fields(text, event, options or None))
    if key is not None:
        kind = event[key_column].dataType.simpleString()  # type: ignore[index]
        why = (
            f"the Kafka key of this tombstone is not a valid {kind} for key column {key_column!r}"
            if key_format == "text"
            else f"the Kafka key of this tombstone, read as JSON, is no {kind} for key column {key_column!r}"
            " (a JSON string or number, or an object with that field)"
        )
        unreadable = F.when(tombstone & F.col("key").isNotNull() & key.isNull(), F.lit(why)).otherwise(
            unreadable
        )
    out = parsed.select(*(field(f) for f in event.fields), *keep, unreadable.alias(ERROR_COLUMN))
    return remember(out, Parsed(frame, event, key_column, key_format, options))


def parse_avro(
    frame: DataFrame,
    registry: str | Mapping[str, Any] | Registry,
    *,
    schema: str | Mapping[str, Any] | None = None,
    subject: str | None = None,
    key_column: str | None = None,
    key_format: RegistryKeyFormat = "text",
) -> DataFrame:
    """Decode Kafka values written in Confluent's wire format with Avro, as parse_json parses JSON.

    registry: the schema registry's URL, or confluent-kafka's SchemaRegistryClient settings
    (`{"url": ..., "basic.auth.user.info": ...}`). Each record is read with the writer schema its
    id names and resolved to the reader `schema` (Avro's JSON) by Avro's rules; without one, the
    reader is the newest version of `subject` when the query starts (by default `<topic>-value`,
    where the frame reads one topic). The columns are the reader's fields; the key, value and
    position are kept, and a record that cannot be read gets why in `_error`: the sink
    dead-letters it. Tombstones (a null value) keep deleting, their `key_column` from the Kafka key:
    its text, JSON, or (`key_format="avro"`) Avro in Confluent's wire format, read with its own
    writer schema: the key, or its record's field `key_column`.
    """
    try:
        import fastavro
    except ImportError:
        raise error("SINK_FORMAT_MISSING", what="parse_avro", needs="fastavro") from None
    given = Registry.of(registry)
    if schema is None:
        schema = _newest(frame, given, subject, "parse_avro").schema_str
    try:
        reader = json.loads(schema) if isinstance(schema, str) else dict(schema)
        parsed = fastavro.parse_schema(reader)
    except Exception as exc:
        raise error(
            "SINK_READER_SCHEMA_INVALID", kind="Avro", reason=(str(exc) or type(exc).__name__).splitlines()[0]
        ) from None
    event = avro.spark_type(parsed)
    if not isinstance(event, T.StructType):
        raise error("SINK_AVRO_SCHEMA_NOT_RECORD", type=event.simpleString())
    keys = avro.AvroKeys(key_column) if key_format == "avro" and key_column else None
    decoder = Decoder(given, avro.AvroValues(reader), event, _keep(frame, event), keys)
    return _decoded(frame, decoder, key_column, key_format, get_args(RegistryKeyFormat))


def parse_protobuf(
    frame: DataFrame,
    registry: str | Mapping[str, Any] | Registry,
    *,
    message: str | None = None,
    subject: str | None = None,
    key_column: str | None = None,
    key_format: KeyFormat = "text",
) -> DataFrame:
    """Decode Kafka values written in Confluent's wire format with Protobuf, as parse_avro does Avro.

    The reader is `message` (a full name; by default the first message) of the newest schema of
    `subject` (by default `<topic>-value`) when the query starts. Each record's schema id and
    message indexes must name that message; it is parsed by the reader message, so its fields
    are taken by number, as Protobuf reads an evolved message: one the writer has not has its
    default (NULL where it has presence).
    """
    try:
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from google.protobuf import descriptor_pb2
    except ImportError:
        raise error("SINK_FORMAT_MISSING", what="parse_protobuf", needs="protobuf") from None
    given = Registry.of(registry)
    newest = _newest(frame, given, subject, "parse_protobuf")
    if newest.schema_type != "PROTOBUF":
        raise error(
            "SINK_READER_SCHEMA_INVALID", kind="Protobuf", reason=f"it is {newest.schema_type or 'AVRO'}"
        )
    try:
        files = tuple(protobuf.files_of(given, newest))
        pool = protobuf.pool_of(files)
        top = descriptor_pb2.FileDescriptorProto.FromString(files[-1])
        name = message or f"{top.package + '.' if top.package else ''}{top.message_type[0].name}"
        descriptor = pool.FindMessageTypeByName(name)
    except (ValueError, KeyError, IndexError, SchemaRegistryError, TypeError) as exc:
        raise error(
            "SINK_READER_SCHEMA_INVALID",
            kind="Protobuf",
            reason=(str(exc) or type(exc).__name__).splitlines()[0],
        ) from None
    event = protobuf.spark_type(descriptor)
    values = protobuf.ProtobufValues(files, descriptor.full_name)
    decoder = Decoder(given, values, event, _keep(frame, event))
    return _decoded(frame, decoder, key_column, key_format, get_args(KeyFormat))


def _newest(frame: DataFrame, registry: Registry, subject: str | None, what: str) -> Any:
    """The newest schema of the subject (by default the frame's topic's value subject)."""
    subject = subject or _value_subject(frame, what)
    try:
        return registry.latest(subject).schema
    except UnknownSchema:
        raise error("SINK_REGISTRY_SUBJECT_UNKNOWN", subject=subject, registry=registry.where) from None


def _decoded(
    frame: DataFrame, decoder: Decoder, key_column: str | None, key_format: str, formats: tuple[str, ...]
) -> DataFrame:
    """The frame's values decoded in its tasks; a tombstone's key column from its Kafka key (by the
    decoder, where the key is Avro)."""
    event = decoder.fields
    _check_fields(event, key_column, key_format, formats)
    decoded = frame.select(*decoder.keep).mapInArrow(decoder, decoder.out_schema())
    asked = Parsed(frame, event, key_column, key_format, None, decoder)
    if key_column is None or decoder.keys is not None:
        return remember(decoded, asked)
    key = _tombstone_key(event[key_column], key_format)
    tombstone = F.col("value").isNull()
    kind = event[key_column].dataType.simpleString()
    why = f"the Kafka key of this tombstone is not a valid {kind} for key column {key_column!r}"
    out = decoded.withColumns(
        {
            key_column: F.when(tombstone, key).otherwise(F.col(key_column)),
            ERROR_COLUMN: F.when(tombstone & F.col("key").isNotNull() & key.isNull(), F.lit(why)).otherwise(
                F.col(ERROR_COLUMN)
            ),
        }
    )
    return remember(out, asked)


def _value_subject(frame: DataFrame, what: str) -> str:
    """`<topic>-value`, Confluent's default subject, where the frame reads one topic by name."""
    source, _ = read_plan(frame)
    topics = (source.options.get("subscribe") or "").split(",") if source is not None else []
    if len(topics) != 1 or not topics[0].strip():
        raise error("SINK_REGISTRY_SUBJECT_NEEDED", what=what)
    return f"{topics[0].strip()}-value"


def _check_fields(
    event: T.StructType,
    key_column: str | None,
    key_format: str,
    formats: tuple[str, ...] = get_args(KeyFormat),
) -> None:
    clash = [f.name for f in event.fields if f.name in (*KEEP, ERROR_COLUMN, _CORRUPT)]
    if clash:
        raise error("SINK_SCHEMA_FIELDS_CLASH", fields=clash)
    if key_column is not None and key_column not in event.fieldNames():
        raise error("SINK_KEY_COLUMN_NOT_IN_SCHEMA", key_column=key_column, schema=event.simpleString())
    if key_format not in formats:
        raise error("SINK_KEY_FORMAT_UNKNOWN", key_format=key_format, formats=" or ".join(map(repr, formats)))


def _tombstone_key(field: T.StructField, key_format: str) -> Column:
    """The key column of a tombstone, from its Kafka key; null where the key does not give one."""
    text = F.col("key").cast("string")
    if key_format == "text":
        return text.try_cast(field.dataType)
    first = F.regexp_extract(text, r"^[ \t\n\r]*(.)", 1)  # JSON's own whitespace
    bare = T.StructType([field])
    enveloped = T.StructType([T.StructField("payload", bare)])
    member = F.coalesce(
        F.from_json(text, bare).getField(field.name),
        F.from_json(text, enveloped).getField("payload").getField(field.name),
    )
    scalar = F.get_json_object(text, "$").try_cast(field.dataType)
    return F.when(first == "{", member).when(first.rlike(r'["0-9tf-]'), scalar)


def _struct(frame: DataFrame, schema: str | T.StructType) -> T.StructType:
    if isinstance(schema, T.StructType):
        return schema
    probe = frame.select(F.from_json(F.lit("{}"), schema).alias("s")).schema["s"].dataType
    assert isinstance(probe, T.StructType)
    return probe


def _unreadable_fields(text: Column, event: T.StructType, options: dict[str, Any] | None) -> Column:
    """Why a value did not parse: each field present as text but absent as its type, or the JSON itself.

    No options is None, never {}: Spark Connect sends {} as an empty map, typed MAP<VOID, VOID>,
    which from_json refuses (INVALID_OPTIONS.NON_STRING_TYPE)."""
    as_text = T.StructType([T.StructField(f.name, T.StringType()) for f in event.fields])
    raw = F.from_json(text, as_text, options)
    typed = F.from_json(text, event, options)
    reasons = [
        F.when(
            raw.getField(f.name).isNotNull() & typed.getField(f.name).isNull(),
            F.concat(
                F.lit(f"field {f.name!r}: "),
                F.substring(raw.getField(f.name), 1, 200),
                F.lit(f" is not a valid {f.dataType.simpleString()}"),
            ),
        )
        for f in event.fields
    ]
    joined = F.concat_ws("; ", *reasons)
    return F.when(joined != "", joined).otherwise(F.lit("the value is not a JSON object of the schema"))
