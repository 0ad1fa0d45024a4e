"""Event values in Avro or Protobuf, written as a schema registry's serializers write them.

add_events encodes them before its COPY, in the caller's transaction: the
schema is registered (or found) under its subject, its id is kept per process,
and the outbox row holds the framed bytes (outbox/core/wire.py), so the relay
publishes them as it publishes any value. Encoding is Confluent's own
serializers', so consumers with Confluent's deserializers read them as theirs.

    add_event(conn, "orders", Avro({"id": 42, "status": "paid"}, ORDER_SCHEMA), key="42")
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from outbox.core import secrets
from outbox.core.registry import Registry, transport_error
from outbox.errors import error

SCHEMA_REGISTRY_URL = "SCHEMA_REGISTRY_URL"
Subject = Literal["topic", "record", "topic_record"]  # Confluent's subject name strategies


@dataclass(frozen=True)
class Avro:
    """A record (a mapping) and its Avro schema (Avro's JSON, as text or parsed)."""

    record: Mapping[str, Any]
    schema: str | Mapping[str, Any]
    subject: Subject = "topic"  # `<topic>-value`; "record": the record's full name; "topic_record": both

    def text(self) -> str:
        return self.schema if isinstance(self.schema, str) else json.dumps(self.schema, sort_keys=True)

    def name(self) -> str:
        """The record's full name, as a subject strategy names it."""
        parsed = json.loads(self.text())
        name = str(parsed.get("name", "")) if isinstance(parsed, dict) else ""
        space = parsed.get("namespace") if isinstance(parsed, dict) else None
        return f"{space}.{name}" if space and "." not in name else name


@dataclass(frozen=True)
class Protobuf:
    """A message of a generated Protobuf class: its schema is its class's file descriptor."""

    message: Any
    subject: Subject = "topic"

    def name(self) -> str:
        return str(self.message.DESCRIPTOR.full_name)


Encoded = Avro | Protobuf


def registry_of(given: str | Mapping[str, Any] | Registry | None) -> Registry:
    """The registry to encode with: the one given, else SCHEMA_REGISTRY_URL's."""
    if given is None:
        url = os.environ.get(SCHEMA_REGISTRY_URL)
        if not url:
            raise error("OUTBOX_REGISTRY_MISSING", env=SCHEMA_REGISTRY_URL)
        given = secrets.environment_registry(url)
    return Registry.of(given)


def subject(value: Encoded, topic: str) -> str:
    """The subject the value's schema is registered under, as Confluent's strategies name it."""
    return {
        "topic": f"{topic}-value",
        "record": value.name(),
        "topic_record": f"{topic}-{value.name()}",
    }[value.subject]


def encode(value: Encoded, topic: str, registry: Registry) -> bytes:
    """The value framed under its schema's id; one line (an OutboxError) where it cannot be."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.serialization import MessageField, SerializationContext

    serializer = _serializer(value, registry)
    where = subject(value, topic)
    try:
        encoded = serializer(
            value.record if isinstance(value, Avro) else value.message,
            SerializationContext(topic, MessageField.VALUE),
        )
    except SchemaRegistryError as exc:
        code = "" if exc.error_code == exc.http_status_code else f", error {exc.error_code}"
        reason = f"HTTP {exc.http_status_code}{code}{_rule(registry, where, exc)}: {exc.error_message}"
        raise error("OUTBOX_SCHEMA_REFUSED", subject=where, registry=registry.where, reason=reason) from None
    except transport_error() as exc:
        raise error(
            "OUTBOX_REGISTRY_UNAVAILABLE", registry=registry.where, reason=type(exc).__name__
        ) from None
    except Exception as exc:  # the serializer's own refusal, which may quote the value: not shown
        bad = _unmatched_fields(value) if isinstance(value, Avro) else None
        kind, reason = type(value).__name__, bad or type(exc).__name__
        raise error("OUTBOX_VALUE_NOT_ENCODABLE", kind=kind, name=value.name(), reason=reason) from None
    assert isinstance(encoded, bytes)
    return encoded


def _rule(registry: Registry, subject: str, refused: Exception) -> str:
    """The compatibility rule that refused a schema (HTTP 409), as the registry tells it."""
    if getattr(refused, "http_status_code", None) != 409:
        return ""
    client = registry.client()
    for ask in (lambda: client.get_compatibility(subject), client.get_compatibility):
        try:
            return f", compatibility {ask()}"
        except Exception:  # none set for the subject: the registry's own level
            continue
    return ""


def _unmatched_fields(value: Avro) -> str | None:
    """Which fields of a record the serializer refused do not match their types, by name only (a
    value may be a secret); None where the record matches its schema."""
    import fastavro
    from fastavro.validation import validate

    schema = fastavro.parse_schema(json.loads(value.text()))
    if validate(dict(value.record), schema, raise_errors=False):
        return None
    if not isinstance(schema, dict):
        return "it does not match the schema"
    named = dict(schema.get("__named_schemas", {}))
    bad = [
        f["name"]
        for f in schema.get("fields", [])
        if not validate(
            value.record.get(f["name"], f.get("default")),
            fastavro.parse_schema(f["type"], named_schemas=named),
            raise_errors=False,
        )
    ]
    unknown = sorted(str(k) for k in value.record if k not in {f["name"] for f in schema.get("fields", [])})
    said = [f"field(s) {', '.join(bad)} do not match their types"] if bad else []
    said += [f"field(s) {', '.join(unknown)} are not in the schema"] if unknown else []
    return "; ".join(said) or "it does not match the schema"


_serializers: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def _serializer(value: Encoded, registry: Registry) -> Any:
    """Confluent's serializer of the value's schema, one per process: it keeps the schema's id."""
    import confluent_kafka.schema_registry as sr

    strategy = {
        "topic": sr.topic_subject_name_strategy,
        "record": sr.record_subject_name_strategy,
        "topic_record": sr.topic_record_subject_name_strategy,
    }[value.subject]
    conf = {"subject.name.strategy": strategy}
    if isinstance(value, Avro):
        key: tuple[Any, ...] = (registry.key, "avro", value.text(), value.subject)
    else:
        key = (registry.key, "protobuf", type(value.message), value.subject)
    with _lock:
        found = _serializers.get(key)
        if found is None:
            if isinstance(value, Avro):
                from confluent_kafka.schema_registry.avro import AvroSerializer

                found = AvroSerializer(registry.client(), value.text(), conf=conf)
            else:
                from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

                found = ProtobufSerializer(type(value.message), registry.client(), conf=conf)
            _serializers[key] = found
        return found
