"""Protobuf values in Confluent's wire format, decoded in bulk into the columns of a reader message.

After the magic byte and the schema id, a Protobuf body starts with the path
of its message in the schema's file: a count and indexes, as zig-zag varints
(a lone 0: the first message). The writer's file comes from the registry by
id (serialized, as a FileDescriptorProto, the form Confluent's Python
serializer registers; or .proto text, as Java's does), and the path must
name the reader's message. The value is then parsed by the reader message
itself, so its fields are taken by number, as Protobuf reads an evolved
message: a field renamed keeps its values, one the writer has not has its
default (NULL where it has presence), one the reader has not is left out.

Types: integers as Spark's (uint64 as decimal(20,0)), enums by name,
messages as structs (a message that holds itself: JSON text), repeated as
arrays, maps as maps, google.protobuf.Timestamp as a timestamp, the wrappers
(StringValue, ...) as their value.
"""

from __future__ import annotations

import base64
import importlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from importlib import resources
from pathlib import Path
from typing import Any

from pyspark.sql import types as T

from outbox.core.errors import OutboxError
from outbox.core.registry import Registry, UnknownSchema
from outbox.core.wire import framed
from sinks.postgres.decoded import Read

_TIMESTAMP = "google.protobuf.Timestamp"
# google.protobuf's wrappers: a scalar that may be absent, read as its value (NULL where unset).
_WRAPPERS = frozenset(
    f"google.protobuf.{name}Value"
    for name in ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")
)
MAIN = "registered.proto"  # the file name a schema registered as .proto text is compiled under
_SCALARS: dict[int, T.DataType] = {}  # FieldDescriptor type -> Spark type, filled below


def _scalars() -> dict[int, T.DataType]:
    if not _SCALARS:
        from google.protobuf.descriptor import FieldDescriptor as F

        _SCALARS.update(
            {
                F.TYPE_DOUBLE: T.DoubleType(),
                F.TYPE_FLOAT: T.FloatType(),
                F.TYPE_INT64: T.LongType(),
                F.TYPE_SINT64: T.LongType(),
                F.TYPE_SFIXED64: T.LongType(),
                F.TYPE_UINT64: T.DecimalType(20, 0),
                F.TYPE_FIXED64: T.DecimalType(20, 0),
                F.TYPE_INT32: T.IntegerType(),
                F.TYPE_SINT32: T.IntegerType(),
                F.TYPE_SFIXED32: T.IntegerType(),
                F.TYPE_UINT32: T.LongType(),
                F.TYPE_FIXED32: T.LongType(),
                F.TYPE_BOOL: T.BooleanType(),
                F.TYPE_STRING: T.StringType(),
                F.TYPE_BYTES: T.BinaryType(),
                F.TYPE_ENUM: T.StringType(),
            }
        )
    return _SCALARS


def spark_type(message: Any, open_messages: tuple[str, ...] = ()) -> T.StructType:
    """The Spark type of a message descriptor's fields."""
    inner = (*open_messages, message.full_name)
    return T.StructType([T.StructField(f.name, _field_type(f, inner)) for f in message.fields])


def _field_type(field: Any, open_messages: tuple[str, ...]) -> T.DataType:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return T.MapType(_single_type(key, open_messages), _single_type(value, open_messages))
    single = _single_type(field, open_messages)
    return T.ArrayType(single) if _repeated(field) else single


def _single_type(field: Any, open_messages: tuple[str, ...]) -> T.DataType:
    message = field.message_type
    if message is None:
        return _scalars()[field.type]
    if message.full_name == _TIMESTAMP:
        return T.TimestampType()
    if message.full_name in _WRAPPERS:
        return _single_type(message.fields_by_name["value"], open_messages)
    if message.full_name in open_messages:
        return T.StringType()  # a message that holds itself: its JSON text
    return spark_type(message, open_messages)


def _repeated(field: Any) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf 6 and newer; `label` is gone from 7
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _is_map(field: Any) -> bool:
    return _repeated(field) and field.message_type is not None and field.message_type.GetOptions().map_entry


def to_python(message: Any) -> dict[str, Any]:
    """A parsed message's fields as Python values: None for a field not set that has presence."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _single(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        if field.message_type.full_name == _TIMESTAMP:
            return value.ToDatetime(tzinfo=UTC)
        if field.message_type.full_name in _WRAPPERS:
            return value.value
        return to_python(value)
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    return value


def message_indexes(body: memoryview) -> tuple[list[int], int]:
    """The message's path in its file and where its bytes start; ValueError where they do not read."""
    at = 0

    def varint() -> int:
        nonlocal at
        shift = result = 0
        while True:
            if at >= len(body) or shift > 63:
                raise ValueError("the message indexes end before they do")
            byte = body[at]
            at += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)  # zig-zag

    count = varint()
    if count == 0:
        return [0], at
    if count < 0 or count > 100:
        raise ValueError(f"{count} message indexes")
    return [varint() for _ in range(count)], at


def message_at(file: Any, indexes: Sequence[int]) -> Any:
    """The message of a file descriptor at that path; IndexError where there is none."""
    found = list(file.message_types_by_name.values())[indexes[0]]
    for i in indexes[1:]:
        found = found.nested_types[i]
    return found


def files_of(registry: Registry, schema: Any) -> list[bytes]:
    """The serialized FileDescriptorProtos of a registered schema, those it imports first.

    A schema is registered serialized (base64, as Confluent's Python serializer does) or as
    .proto text (as Java's does): text is compiled here, with protoc (grpcio-tools), since
    a registry's own `format=serialized` is not to be relied on (Apicurio 3.3 sends raw bytes).
    """
    data = _serialized(schema.schema_str)
    if data is None:
        return compiled(_texts(registry, schema))
    files: list[bytes] = []
    for ref in schema.references or []:
        files += files_of(registry, registry.version(ref.subject, ref.version).schema)
    return [*files, data]


def _texts(registry: Registry, schema: Any) -> dict[str, str]:
    """The .proto texts of a schema and those it references, by import path; its own is MAIN."""
    texts: dict[str, str] = {}

    def collect(found: Any) -> None:
        for ref in found.references or []:
            if ref.name not in texts:
                referenced = registry.version(ref.subject, ref.version).schema
                texts[ref.name] = referenced.schema_str
                collect(referenced)

    collect(schema)
    return {**texts, MAIN: schema.schema_str}


def compiled(texts: dict[str, str]) -> list[bytes]:
    """.proto texts compiled by protoc into FileDescriptorProtos, imports first, MAIN last."""
    try:
        from grpc_tools import protoc
    except ImportError:
        raise ValueError("it is .proto text, which needs protoc: pip install grpcio-tools") from None
    from google.protobuf import descriptor_pb2

    include = str(resources.files("grpc_tools") / "_proto")  # the well-known types' .proto files
    with tempfile.TemporaryDirectory(prefix="outbox-proto-") as folder:
        for name, text in texts.items():
            path = Path(folder, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        out = Path(folder, "set.pb")
        argv = [
            "protoc",
            f"-I{folder}",
            f"-I{include}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            MAIN,
        ]
        if protoc.main(argv) != 0:
            raise ValueError("protoc does not compile its .proto text (its error is on the worker's stderr)")
        found = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return [f.SerializeToString() for f in found.file]


def _serialized(text: str) -> bytes | None:
    """A base64 FileDescriptorProto's bytes; None for anything else (.proto text)."""
    from google.protobuf import descriptor_pb2

    try:
        data = base64.b64decode(text, validate=True)
        descriptor_pb2.FileDescriptorProto.FromString(data)
    except Exception:
        return None
    return data


def pool_of(files: Sequence[bytes]) -> Any:
    """A descriptor pool holding the files, and the well-known types they import (google/protobuf/*,
    google/type/* where googleapis-common-protos is installed), which Confluent's Python serializer
    does not register as references."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    given = {descriptor_pb2.FileDescriptorProto.FromString(data).name: data for data in files}
    added: set[str] = set()

    def add(name: str, data: bytes) -> None:
        for dependency in descriptor_pb2.FileDescriptorProto.FromString(data).dependency:
            if dependency not in added:
                found = given.get(dependency) or _well_known(dependency)
                if found is not None:
                    add(dependency, found)
        if name not in added:
            pool.AddSerializedFile(data)
            added.add(name)

    for name, data in given.items():
        add(name, data)
    return pool


def _well_known(path: str) -> bytes | None:
    """The serialized file of a well-known type the Python runtime ships, by its import path."""
    if not path.endswith(".proto") or not path.startswith(("google/protobuf/", "google/type/")):
        return None
    try:
        module = importlib.import_module(path[: -len(".proto")].replace("/", ".") + "_pb2")
    except ImportError:
        return None
    return bytes(module.DESCRIPTOR.serialized_pb)


@dataclass(frozen=True)
class ProtobufValues:
    """The reader message: its files, serialized, and its full name (decoded.Decoder)."""

    files: tuple[bytes, ...]
    message: str

    def descriptor(self) -> Any:
        return pool_of(self.files).FindMessageTypeByName(self.message)

    def reader_in(self, registry: Registry) -> Read:
        return _Writers(registry, self.descriptor()).decode


# Per Python worker: (registry, schema id) -> its file descriptor, or why none.
_files: dict[tuple[Any, int], Any] = {}


class _Writers:
    """Values parsed by the reader's message, as Protobuf reads an evolved message: by field number
    (a field renamed keeps its values; one the writer has not has its default, or none where it has
    presence), after the writer's id and message path are checked against the registry."""

    def __init__(self, registry: Registry, reader: Any) -> None:
        from google.protobuf import message_factory

        self.registry = registry
        self.reader = reader
        self.kind = message_factory.GetMessageClass(reader)

    def file(self, schema_id: int) -> Any:
        key = (self.registry.key, schema_id)
        found = _files.get(key)
        if found is None:
            found = _files[key] = self._fetch(schema_id)
        return found

    def _fetch(self, schema_id: int) -> Any:
        """The writer's file descriptor, or why it has none. Only the registry's answers are kept: a
        registry that fails to answer raises, and is asked again."""
        from google.protobuf import descriptor_pb2

        try:
            schema = self.registry.schema(schema_id)
        except UnknownSchema:
            return f"schema id {schema_id} is not known to the schema registry at {self.registry.where}"
        if schema.schema_type != "PROTOBUF":
            return f"schema id {schema_id} is a {schema.schema_type or 'AVRO'} schema, not Protobuf"
        try:
            files = files_of(self.registry, schema)
            name = descriptor_pb2.FileDescriptorProto.FromString(files[-1]).name
            return pool_of(files).FindFileByName(name)
        except (OutboxError, TimeoutError):
            raise  # the registry refused or did not answer: no fault of the record's, and not kept
        except Exception as exc:
            return f"schema id {schema_id} does not read as Protobuf: {exc}"

    def decode(self, values: list[bytes | None]) -> tuple[list[dict[str, Any] | None], list[str | None]]:
        records: list[dict[str, Any] | None] = []
        errors: list[str | None] = []
        for value in values:
            record, why = None, None
            got = framed(value) if value is not None else None
            if isinstance(got, str):
                why = got
            elif got is not None:
                record, why = self._one(*got)
            records.append(record)
            errors.append(why)
        return records, errors

    def _one(self, schema_id: int, body: memoryview) -> tuple[dict[str, Any] | None, str | None]:
        file = self.file(schema_id)
        if isinstance(file, str):
            return None, file
        try:
            indexes, start = message_indexes(body)
            written = message_at(file, indexes).full_name
            if written != self.reader.full_name:
                wanted = self.reader.full_name
                return None, f"the value is a {written} (writer schema id {schema_id}), not a {wanted}"
            return to_python(self.kind.FromString(bytes(body[start:]))), None
        except Exception as exc:  # DecodeError, an index past the file's messages, ...
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            return None, (
                f"the value does not decode as Protobuf of writer schema id {schema_id}:"
                f" {type(exc).__name__}{': ' + text if text else ''}"
            )
