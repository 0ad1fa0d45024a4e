"""Transactional outbox and exactly-once relay from PostgreSQL to Kafka; the framework's root.

core/        the base both halves (this one and `sinks`) stand on: settings, errors, PostgreSQL, Kafka
writer.py    add_event / add_events: events in the caller's transaction; formats.py: Avro, Protobuf
migrate.py   the framework's Alembic migrations, run from code (`outbox db`)
relay/       the relay daemon: outbox table -> Kafka, exactly once
verify/      `outbox verify`: a topic checked for duplicates, order, gaps
status/      `outbox status`; trace/: `outbox trace`
cli/         the `outbox` command; __main__.py its entry point
logs.py      log lines as JSON or text; stopping.py: SIGTERM before start-up ends
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outbox.core.errors import (
    ConfigError,
    DataLossError,
    Fenced,
    NotReady,
    OutboxError,
    ServiceUnavailable,
    Standby,
)

if TYPE_CHECKING:
    from outbox.formats import Avro, Protobuf
    from outbox.relay.relay import Relay
    from outbox.relay.settings import RelaySettings
    from outbox.writer import Event, add_event, add_events

__all__ = [
    "Avro",
    "ConfigError",
    "DataLossError",
    "Event",
    "Fenced",
    "NotReady",
    "OutboxError",
    "Protobuf",
    "Relay",
    "RelaySettings",
    "ServiceUnavailable",
    "Standby",
    "add_event",
    "add_events",
]
__version__ = "0.1.0"

# Imported on first use: `import outbox` stays as light as the errors, so that the CLI's
# entry point can catch stop signals before its heavy imports (stopping.py).
_LAZY = {
    "Avro": "outbox.formats",
    "Protobuf": "outbox.formats",
    "Event": "outbox.writer",
    "add_event": "outbox.writer",
    "add_events": "outbox.writer",
    "Relay": "outbox.relay.relay",
    "RelaySettings": "outbox.relay.settings",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")
