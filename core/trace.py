"""What the sink writes for tracing and `outbox trace` reads back: both halves derive it here.

An event is found by its key as text (key columns joined with ','), hashed to
a uuid so the trace table's one index compares 16 bytes. The outbox event a
sink writes for an input record has an id derived from that record's place
(sink, topic, partition, offset): the same record always gives the same id,
and a trace finds it without a link stored per row.
"""

from __future__ import annotations

import hashlib
import uuid

from psycopg import sql

OUTCOMES = ("applied", "deleted", "duplicate", "stale")


def event_hash(key_text: str) -> uuid.UUID:
    """The uuid an event's key text is recorded under: md5 of its UTF-8 bytes, as PostgreSQL's md5()::uuid."""
    return uuid.UUID(hashlib.md5(key_text.encode()).hexdigest())


def outbox_event_id(sink: str, topic: str, partition: int, offset: int) -> uuid.UUID:
    """The id of the outbox event the sink wrote for the input record at topic/partition/offset."""
    return event_hash(f"{sink}\n{topic}\n{partition}\n{offset}")


def event_hash_sql(key_text: sql.Composable) -> sql.Composable:
    return sql.SQL("md5({})::uuid").format(key_text)


def outbox_event_id_sql(sink: sql.Composable, row: str) -> sql.Composable:
    """outbox_event_id over a row with _topic, _partition, _offset (alias `row`)."""
    r = sql.Identifier(row)
    return sql.SQL("md5(concat_ws(E'\\n', {sink}, {r}._topic, {r}._partition, {r}._offset))::uuid").format(
        sink=sink, r=r
    )
