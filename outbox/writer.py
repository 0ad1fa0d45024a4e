"""Add events to the outbox inside the caller's transaction.

The event commits or rolls back with the business change it describes; the
relay publishes it to Kafka afterwards. These functions never commit.

    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", [42])
        add_event(conn, "orders", {"id": 42, "status": "paid"}, key="42")

Works with a psycopg 3 Connection, and with a SQLAlchemy Connection or Session
on the `postgresql+psycopg` driver. In a transaction you will PREPARE (two-phase
commit) pass notify=False: PostgreSQL refuses to prepare one that sent a NOTIFY.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from outbox import formats, tracecontext
from outbox.core import tables
from outbox.core.config import schema_name
from outbox.core.kafka import topic_name_valid
from outbox.errors import error

Headers = Mapping[str, bytes | str] | Sequence[tuple[str, bytes | str]]


@dataclass(frozen=True)
class Event:
    """One outbox event. `value` may be bytes, str, anything JSON can encode, an Avro or Protobuf
    value (outbox.formats); None is a tombstone."""

    topic: str
    value: Any = None
    key: bytes | str | None = None
    headers: Headers = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def row(self) -> tuple[object, ...]:
        """The event as the outbox stores it; refused here, with one line, whatever Kafka or the
        table would refuse later (a topic Kafka cannot have halts the relay at that event)."""
        _check_topic(self.topic)
        headers = self.headers or {}
        pairs = list(headers.items() if isinstance(headers, Mapping) else headers)
        for name, _ in pairs:
            if not isinstance(name, str):
                raise error("OUTBOX_HEADER_NAME_NOT_STR", kind=type(name).__name__)
            if "\x00" in name or not _utf8(name):  # PostgreSQL text holds neither
                raise error("OUTBOX_HEADER_NAME_INVALID", name=name)
            if name == tables.EVENT_ID_HEADER:  # a second one: consumers would take either
                raise error("OUTBOX_HEADER_RESERVED", name=name)
        return (
            _event_id(self.event_id),
            self.topic,
            _bytes(self.key, "key"),
            _value(self.value),
            [name for name, _ in pairs],
            [_bytes(value, f"header {name!r}") for name, value in pairs],
        )


def _check_topic(topic: object) -> None:
    if not isinstance(topic, str):  # named by its type: the repr of an Event holds its value
        given = type(topic).__name__
        hint = " (add_events(conn, [event]) takes Event objects)" if isinstance(topic, Event) else ""
        raise error("OUTBOX_EVENT_TOPIC_NOT_TEXT", given=given, hint=hint)
    if not topic:
        raise error("OUTBOX_EVENT_TOPIC_MISSING")
    if not topic_name_valid(topic):
        raise error("OUTBOX_EVENT_TOPIC_INVALID", topic=topic)


def add_event(
    conn: Any,
    topic: str,
    value: Any = None,
    *,
    key: bytes | str | None = None,
    headers: Headers | None = None,
    event_id: uuid.UUID | None = None,
    schema: str | None = None,
    notify: bool = True,
    registry: str | Mapping[str, Any] | None = None,
    trace_context: bool = True,
) -> uuid.UUID:
    """Add one event in the caller's open transaction; returns its event id."""
    event = Event(topic, value, key, headers or {}, event_id or uuid.uuid4())
    add_events(conn, [event], schema=schema, notify=notify, registry=registry, trace_context=trace_context)
    return event.event_id


def add_events(
    conn: Any,
    events: Iterable[Event],
    *,
    schema: str | None = None,
    notify: bool = True,
    registry: str | Mapping[str, Any] | None = None,
    trace_context: bool = True,
) -> list[uuid.UUID]:
    """Add many events with one COPY, in order, in the caller's open transaction.

    notify=False: no NOTIFY wakes the relay, which finds the events at its poll interval; for the
    rest of this transaction (`outbox.notify` set LOCAL), so that it can be PREPAREd.
    registry: where an Avro or Protobuf value's schema is registered (outbox/formats.py): a URL or
    confluent-kafka's SchemaRegistryClient settings; by default SCHEMA_REGISTRY_URL.
    trace_context: with OpenTelemetry and a current span, each event that has no `traceparent`
    header gets that span's (outbox/tracecontext.py); False: none is added."""
    traceparent = tracecontext.current() if trace_context else None
    rows = [_traced(e.row(), traceparent) for e in _encoded(events, registry)]
    schema = schema or schema_name()
    target = sql.Identifier(schema, tables.OUTBOX_EVENTS)
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        target, sql.SQL(", ").join(map(sql.Identifier, tables.OUTBOX_COLUMNS))
    )
    raw = _psycopg(conn)
    if not notify:
        raw.execute("SELECT set_config(%s, 'off', true)", [tables.NOTIFY_SETTING])
    try:
        with raw.cursor().copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except psycopg.errors.UndefinedTable:
        raise tables.missing_tables(
            schema, [tables.OUTBOX_EVENTS], note="this transaction is now aborted"
        ) from None
    return [r[0] for r in rows]


def _traced(row: tuple[Any, ...], traceparent: str | None) -> tuple[Any, ...]:
    """The row with the span's traceparent among its headers, unless it has one of its own."""
    *head, names, values = row
    if traceparent is None or tracecontext.HEADER in names:
        return row
    return (*head, [*names, tracecontext.HEADER], [*values, traceparent.encode()])


def _encoded(events: Iterable[Event], registry: str | Mapping[str, Any] | None) -> Iterator[Event]:
    """The events, each Avro or Protobuf value framed as its registry's serializers frame it."""
    found = None
    for event in events:
        if isinstance(event.value, formats.Avro | formats.Protobuf):
            _check_topic(event.topic)  # before a subject is named after it
            found = found or formats.registry_of(registry)
            event = replace(event, value=formats.encode(event.value, event.topic, found))
        yield event


def _psycopg(conn: Any) -> psycopg.Connection:
    """The psycopg connection under `conn`, inside an open transaction."""
    alchemy = not isinstance(conn, psycopg.Connection)
    driver = _driver(conn) if alchemy else conn
    # In autocommit mode each statement commits alone: the event would commit even if the
    # change it belongs to then fails. Only an explicit transaction block is fine.
    if driver.autocommit and driver.info.transaction_status == TransactionStatus.IDLE:
        how = (
            "use a connection in a transaction (`with engine.begin() as conn:`, not"
            " isolation_level='AUTOCOMMIT')"
            if alchemy
            else "call it inside `with conn.transaction():`"
        )
        raise error("OUTBOX_NO_TRANSACTION", how=how)
    return driver


def _driver(conn: Any) -> psycopg.Connection:
    """The psycopg connection under a SQLAlchemy Session or Connection."""
    try:  # a Session gives its Connection; a Connection its DBAPI connection.
        connection = conn.connection() if callable(getattr(conn, "connection", None)) else conn
        # As a statement would: SQLAlchemy begins a transaction at a Connection's first one, and
        # only commits one it began. Without, commit() did nothing and the pool rolled the event back.
        if not connection.in_transaction():
            connection.begin()
        driver = connection.connection.driver_connection
    except AttributeError:
        raise error("OUTBOX_CONNECTION_UNSUPPORTED", kind=type(conn).__name__) from None
    if not isinstance(driver, psycopg.Connection):
        raise error("OUTBOX_DRIVER_NOT_PSYCOPG", module=type(driver).__module__)
    return driver


def _event_id(given: object) -> uuid.UUID:
    """A UUID, or its text; anything else the table would refuse, aborting the caller's transaction."""
    if isinstance(given, uuid.UUID):
        return given
    if isinstance(given, str):
        with contextlib.suppress(ValueError):
            return uuid.UUID(given)
    raise error("OUTBOX_EVENT_ID_INVALID", event_id=given)


def _utf8(text: str) -> bytes | None:
    """The text as UTF-8; None for a str that has none (a lone surrogate)."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return None


def _bytes(value: bytes | str | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        if (encoded := _utf8(value)) is None:
            raise error("OUTBOX_FIELD_NOT_UTF8", what=what)
        return encoded
    raise error("OUTBOX_FIELD_NOT_BYTES", what=what, kind=type(value).__name__)


def _value(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes | str):
        return _bytes(value, "value")
    try:  # NaN and Infinity are no JSON: a consumer's parser refuses them
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise error("OUTBOX_VALUE_NOT_SERIALISABLE", reason=exc) from None
    return _bytes(text, "value")
