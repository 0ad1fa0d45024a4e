"""The records `outbox verify` checks: a topic's committed records, and their ids and sequences."""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from confluent_kafka import Message

from outbox._core.committed import place, read_committed
from outbox._core.tables import EVENT_ID_HEADER
from outbox.verify.findings import Record, sequence


def committed(
    bootstrap: str, topic: str, start: Mapping[int, int] | None = None, timeout: float = 60.0
) -> list[Message]:
    """Every committed record (read_committed) from `start` (default: the beginning) up to the end now."""
    return read_committed({"bootstrap.servers": bootstrap}, topic, start=start, timeout=timeout)


def record(
    message: Message, *, id_header: str | None, id_field: str | None, order_field: str | None
) -> Record:
    """The parts of a message the checks look at: its event id (a header or a JSON field) and sequence."""
    doc = _json(message.value()) if (id_field or order_field) else {}
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


def _json(value: bytes | None) -> dict[str, Any]:
    """The value as a JSON object; numbers with a fraction as written (Decimal), not as binary floats,
    whose 16 digits made 1700000000.1234567 and ...566 one number, and hid the decrease."""
    if value is None:
        return {}
    try:
        doc = json.loads(value, parse_float=Decimal)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
