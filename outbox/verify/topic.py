"""The records `outbox verify` checks: a topic's committed records, and their ids and sequences."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from confluent_kafka import Message

from outbox.core.committed import place, read_committed
from outbox.core.registry import Registry, UnknownSchema
from outbox.core.tables import EVENT_ID_HEADER
from outbox.core.wire import framed
from outbox.verify.findings import Record, sequence


def committed(
    bootstrap: str, topic: str, start: Mapping[int, int] | None = None, timeout: float = 60.0
) -> list[Message]:
    """Every committed record (read_committed) from `start` (default: the beginning) up to the end now."""
    return read_committed({"bootstrap.servers": bootstrap}, topic, start=start, timeout=timeout)


Decode = Callable[[bytes | None], dict[str, Any]]


def record(
    message: Message,
    *,
    id_header: str | None,
    id_field: str | None,
    order_field: str | None,
    decode: Decode | None = None,
) -> Record:
    """The parts of a message the checks look at: its event id (a header or a field of the value) and
    sequence. decode: what reads a value's fields (default: JSON; `avro_fields` under a registry)."""
    doc = (decode or json_fields)(message.value()) if (id_field or order_field) else {}
    headers: dict[str, Any] = dict(message.headers() or [])
    if id_field:  # an id with a fraction (odd, but said before as Python's float prints it) as it was
        found = doc.get(id_field)
        event_id = _text(float(found) if isinstance(found, Decimal) else found)
    else:
        event_id = _text(headers.get(id_header or EVENT_ID_HEADER))
    key = message.key()
    number = sequence(_text(doc.get(order_field))) if order_field else None
    return Record(
        *place(message),
        key.decode(errors="replace") if key is not None else None,
        event_id,
        number,
        unordered=bool(order_field) and message.value() is not None and number is None,
    )


def json_fields(value: bytes | None) -> dict[str, Any]:
    """The value as a JSON object; numbers with a fraction as written (Decimal), not as binary floats,
    whose 16 digits made 1700000000.1234567 and ...566 one number, and hid the decrease."""
    if value is None:
        return {}
    try:
        doc = json.loads(value, parse_float=Decimal)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def avro_fields(registry: Registry) -> Decode:
    """A value's fields where it is Avro in Confluent's wire format, read with its writer schema (by
    id, from the registry); JSON otherwise. A value neither reads as has no fields."""
    import fastavro

    schemas: dict[int, Any] = {}

    def decode(value: bytes | None) -> dict[str, Any]:
        got = framed(value or b"")
        if isinstance(got, str):
            return json_fields(value)
        schema_id, body = got
        try:
            if schema_id not in schemas:
                schemas[schema_id] = fastavro.parse_schema(json.loads(registry.schema(schema_id).schema_str))
            doc = fastavro.schemaless_reader(io.BytesIO(body), schemas[schema_id], None)
        except (UnknownSchema, ValueError, EOFError, KeyError, TypeError):
            return {}
        return doc if isinstance(doc, dict) else {}

    return decode


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
