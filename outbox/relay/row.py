"""An outbox row as it passes from the PostgreSQL edge of the relay to the Kafka edge.

Both edges import it from here, so neither imports the other.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    """An outbox row as the relay sends it: the event id already as header bytes."""

    id: int
    event_id: bytes
    topic: str
    key: bytes | None
    value: bytes | None
    header_keys: list[str] | None
    header_values: list[bytes] | None
    created_at: float  # epoch seconds
