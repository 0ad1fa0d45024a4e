"""Reading an event's path: PostgreSQL first (what the sink did, the outbox, the relays' positions),
then the output topic from shortly before the event was applied, for where the relay put it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition
from psycopg import sql

from outbox import tracecontext
from outbox.core import tables
from outbox.core.committed import place, read_committed
from outbox.core.kafka import client_settings
from outbox.core.trace import outbox_event_id
from outbox.errors import error
from outbox.relay.position import Identity, Shard
from outbox.relay.statements import KEY_HASH
from outbox.trace import outcomes
from outbox.trace.report import Applied, DeadLetter, OutboxEvent, Published, Trace

USED = (
    tables.SINK_TRACES,
    tables.SINK_DEAD_LETTERS,
    tables.OUTBOX_EVENTS,
    tables.OUTBOX_IDENTITY,
    tables.RELAY_POSITIONS,
    tables.RELAY_DEAD_LETTERS,
)
# Kafka timestamps come from the relay's host: look this far before the event was applied.
CLOCK_SKEW_S = 60.0


def spellings(event: str) -> list[str]:
    """The key texts an event id may have been recorded as: as given, and a uuid's canonical form."""
    found = [event]
    try:
        canonical = str(uuid.UUID(event))
    except ValueError:
        return found
    return found if canonical == event else [*found, canonical]


def from_database(conn: psycopg.Connection[Any], schema: str, event: str) -> Trace:
    names = {t: sql.Identifier(schema, t) for t in USED}
    texts = spellings(event)
    rows = conn.execute(
        sql.SQL("SELECT {} FROM {} WHERE events && %s::text[] ORDER BY {}").format(
            sql.SQL(outcomes.COLUMNS), names[tables.SINK_TRACES], sql.SQL(outcomes.ORDER)
        ),
        [texts],
    ).fetchall()
    applied = []
    for r in outcomes.records([outcomes.TraceRow(*row) for row in rows], texts):
        box = None
        if r.wrote_outbox and r.outbox_topic:
            box_id = outbox_event_id(r.sink, r.txid, r.round, r.event, r.target)
            box = _outbox_event(conn, names, box_id, r.outbox_topic, r.txid)
        applied.append(
            Applied(r.sink, r.topic, r.partition, r.offset, r.outcome, r.version, r.applied_at, box)
        )
    dead = conn.execute(
        sql.SQL(
            "SELECT sink, topic, kafka_partition, kafka_offset, error, failed_at FROM {}"
            " WHERE key = ANY(%s::bytea[]) ORDER BY failed_at, id"
        ).format(names[tables.SINK_DEAD_LETTERS]),
        [[t.encode() for t in texts]],
    ).fetchall()
    return Trace(event, tuple(applied), tuple(DeadLetter(*d) for d in dead))


def _outbox_event(
    conn: psycopg.Connection[Any],
    names: dict[str, sql.Identifier],
    event_id: uuid.UUID,
    topic: str,
    txid: str,
) -> OutboxEvent:
    """Where the outbox event stands: still in the table (published or not, by the relays' bases),
    dead-lettered by a relay, or gone, which cleanup does only to published rows."""
    row = conn.execute(
        sql.SQL("SELECT e.created_at FROM {events} e WHERE e.txid = %s::xid8 AND e.event_id = %s").format(
            events=names[tables.OUTBOX_EVENTS]
        ),
        [txid, event_id],
    ).fetchone()
    if row is not None:
        publishers = conn.execute(
            sql.SQL(
                "SELECT p.relay, p.shard, p.shards FROM {positions} p, {events} e"
                " WHERE e.txid = %s::xid8 AND e.event_id = %s AND mod({hash}, p.shards) = p.shard"
                " AND pg_visible_in_snapshot(e.txid, p.base::pg_snapshot) ORDER BY 1, 3, 2"
            ).format(
                positions=names[tables.RELAY_POSITIONS],
                events=names[tables.OUTBOX_EVENTS],
                hash=sql.SQL(KEY_HASH),
            ),
            [txid, event_id],
        ).fetchall()
        if not publishers:
            return OutboxEvent(event_id, topic, "waiting", since=row[0])
        return OutboxEvent(event_id, topic, "published", relay=_transactional_id(conn, names, *publishers[0]))
    dead = conn.execute(
        sql.SQL("SELECT relay, error FROM {} WHERE event_id = %s ORDER BY failed_at LIMIT 1").format(
            names[tables.RELAY_DEAD_LETTERS]
        ),
        [event_id],
    ).fetchone()
    if dead is not None:
        return OutboxEvent(event_id, topic, "dead-lettered", relay=dead[0], error=dead[1])
    # Cleaned up, so published: by the one unsharded relay whose base holds the transaction, if one.
    covering = conn.execute(
        sql.SQL(
            "SELECT relay, shard, shards FROM {} WHERE shards = 1"
            " AND pg_visible_in_snapshot(%s::xid8, base::pg_snapshot) ORDER BY relay"
        ).format(names[tables.RELAY_POSITIONS]),
        [txid],
    ).fetchall()
    relay = _transactional_id(conn, names, *covering[0]) if len(covering) == 1 else None
    return OutboxEvent(event_id, topic, "published", relay=relay)


def _transactional_id(
    conn: psycopg.Connection[Any], names: dict[str, sql.Identifier], relay: str, index: int, count: int
) -> str:
    row = conn.execute(sql.SQL("SELECT id::text FROM {}").format(names[tables.OUTBOX_IDENTITY])).fetchone()
    return Identity(relay, str(row[0]) if row else "?", Shard(index, count)).transactional_id


def in_kafka(trace: Trace, servers: str, timeout: float, id_header: str = tables.EVENT_ID_HEADER) -> Trace:
    """The outbox events found in their topics, by the header the relay put each one's id in
    (its --event-id-header): partition, offset, time.

    The waiting ones are looked for too: a relay records in PostgreSQL how far
    it published about once a second, so one killed in between has published
    more than PostgreSQL says. Kafka, read_committed, has the last word."""
    trace = replace(trace, records=tuple(_with_traceparent(r, servers, timeout) for r in trace.records))
    wanted = [r for r in trace.records if r.outbox and r.outbox.state in ("published", "waiting")]
    found: dict[uuid.UUID, Published] = {}
    for topic in sorted({r.outbox.topic for r in wanted if r.outbox}):
        ids = {r.outbox.event_id for r in wanted if r.outbox and r.outbox.topic == topic}
        since = min(r.at for r in wanted if r.outbox and r.outbox.topic == topic)
        found |= _search(servers, topic, ids, since, timeout, id_header)
    return found_in_kafka(trace, found)


def _with_traceparent(record: Applied, servers: str, timeout: float) -> Applied:
    """The input record with its `traceparent` header, read at its position (none where the record
    has none, or is gone from the topic)."""
    consumer = Consumer(
        client_settings(
            {
                "bootstrap.servers": servers,
                "group.id": "outbox-trace",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            },
            "consumer",
        )
    )
    try:
        consumer.assign([TopicPartition(record.topic, record.partition, record.offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None or place(message)[1] != record.offset:
                return record  # the end, or an offset past it: the record is gone
            headers = dict(message.headers() or [])
            value = headers.get(tracecontext.HEADER)
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            return replace(record, traceparent=text or None)
        return record
    except KafkaException as exc:
        raise error("KAFKA_READ_UNREACHABLE", servers=servers, reason=exc.args[0].str()) from None
    finally:
        consumer.close()


def found_in_kafka(trace: Trace, found: Mapping[uuid.UUID, Published]) -> Trace:
    """The trace with what the output topics hold: a found event is published there, whatever
    PostgreSQL said; one PostgreSQL calls published and Kafka lacks gets a note."""
    records = tuple(
        replace(
            r, outbox=replace(r.outbox, state="published", since=None, published=found[r.outbox.event_id])
        )
        if r.outbox and r.outbox.event_id in found
        else r
        for r in trace.records
    )
    said = [r.outbox for r in trace.records if r.outbox and r.outbox.state == "published"]
    missing = [box for box in said if box.event_id not in found]
    note = None
    if missing:
        note = (
            f"{len(missing)} published event(s) not found in Kafka from {CLOCK_SKEW_S:.0f} s before they"
            " were applied: deleted by the topic's retention, or published by a relay on another cluster"
        )
    return replace(trace, records=records, searched=note)


def _search(
    servers: str, topic: str, ids: Iterable[uuid.UUID], since: datetime, timeout: float, id_header: str
) -> dict[uuid.UUID, Published]:
    """Read `topic` (read_committed) from `since` less the clock skew to its end, for these event ids
    in header `id_header`."""
    wanted = {str(i).encode(): i for i in ids}
    start = _offsets_at(servers, topic, (since.timestamp() - CLOCK_SKEW_S) * 1000, timeout)
    found = {}
    for message in read_committed({"bootstrap.servers": servers}, topic, start=start, timeout=timeout):
        headers: dict[str, Any] = dict(message.headers() or [])
        hit = wanted.get(headers.get(id_header) or b"")
        if hit is not None:
            stamp = datetime.fromtimestamp(message.timestamp()[1] / 1000).astimezone()
            found[hit] = Published(*place(message), stamp)
    return found


def _offsets_at(servers: str, topic: str, millis: float, timeout: float) -> dict[int, int]:
    """Per partition, the first offset at or after `millis` (the end where nothing is that late)."""
    consumer = Consumer(
        client_settings({"bootstrap.servers": servers, "group.id": "outbox-trace"}, "consumer")
    )
    try:
        deadline = time.monotonic() + timeout
        metadata = consumer.list_topics(topic, timeout=timeout)
        listed = metadata.topics.get(topic)
        if listed is None or listed.error is not None:
            raise error("KAFKA_TOPIC_MISSING", topic=topic, servers=servers)
        asked = [TopicPartition(topic, p, int(millis)) for p in listed.partitions]
        answered = consumer.offsets_for_times(asked, timeout=max(deadline - time.monotonic(), 1))
    except KafkaException as exc:
        raise error("KAFKA_READ_UNREACHABLE", servers=servers, reason=exc.args[0].str()) from None
    finally:
        consumer.close()
    # -1 (OFFSET_END): no record that late; read_committed then starts at the end, and reads nothing.
    return {tp.partition: tp.offset if tp.offset >= 0 else OFFSET_END for tp in answered}


def prune(conn: psycopg.Connection[Any], schema: str, days: float, batch: int = 50_000) -> Iterable[int]:
    """Delete trace rows older than `days`, `batch` at a time (short locks, a progress line each)."""
    query = sql.SQL(
        "DELETE FROM {t} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {t}"
        " WHERE applied_at < now() - make_interval(secs => %s) LIMIT %s))"
    ).format(t=sql.Identifier(schema, tables.SINK_TRACES))
    while deleted := conn.execute(query, [days * 86400, batch]).rowcount:
        yield deleted
