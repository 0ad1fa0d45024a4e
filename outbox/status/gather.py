"""Reading what `outbox status` shows: the framework's tables, then (if asked) the topics' ends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from psycopg import sql

from outbox.core import tables
from outbox.core.kafka import client_settings
from outbox.relay import registry
from outbox.relay.statements import KEY_HASH
from outbox.status.report import DeadLetters, LedgerPartition, RelayShard, Status, Waiting

USED = (
    tables.OUTBOX_EVENTS,
    tables.RELAY_POSITIONS,
    tables.RELAY_DEAD_LETTERS,
    tables.SINK_PROGRESS,
    tables.SINK_DEAD_LETTERS,
)


def from_database(conn: psycopg.Connection[Any], schema: str) -> Status:
    """Everything PostgreSQL knows: relay shards and what waits for each, sink ledgers, dead letters."""
    names = {t: sql.Identifier(schema, t) for t in USED}
    events = names[tables.OUTBOX_EVENTS]
    # A shard's rows not in its base, by the txid index, as a relay starts a delta (relay/statements.py).
    waiting = sql.SQL(
        "SELECT e.topic, count(*), min(e.created_at) FROM {events} e"
        " WHERE (e.txid >= pg_snapshot_xmax(%(base)s::pg_snapshot)"
        "  OR e.txid = ANY(ARRAY(SELECT pg_snapshot_xip(%(base)s::pg_snapshot))))"
        " AND NOT pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot)"
        " AND mod({hash}, %(count)s) = %(index)s"
        " AND NOT EXISTS (SELECT FROM {dead} d WHERE d.relay = %(relay)s AND d.outbox_id = e.id"
        " AND d.event_id = e.event_id)"
        " GROUP BY e.topic ORDER BY e.topic"
    ).format(events=events, hash=sql.SQL(KEY_HASH), dead=names[tables.RELAY_DEAD_LETTERS])
    relays = []
    for r in registry.registered(conn, schema):
        found = conn.execute(
            waiting,
            {"base": r.base, "count": r.shard.count, "index": r.shard.index, "relay": r.relay},
        ).fetchall()
        relays.append(
            RelayShard(
                r.relay, str(r.shard), r.running, r.base, r.updated_at, tuple(Waiting(*w) for w in found)
            )
        )
    rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(events)).fetchone()
    ledgers = conn.execute(
        sql.SQL(
            "SELECT sink, topic, kafka_partition, next_offset, updated_at FROM {}"
            " ORDER BY sink, topic, kafka_partition"
        ).format(names[tables.SINK_PROGRESS])
    ).fetchall()
    dead = conn.execute(
        sql.SQL(
            "SELECT 'sink', sink, count(*), max(failed_at) FROM {sink} GROUP BY sink"
            " UNION ALL SELECT 'relay', relay, count(*), max(failed_at) FROM {relay} GROUP BY relay"
            " ORDER BY 1 DESC, 2"
        ).format(sink=names[tables.SINK_DEAD_LETTERS], relay=names[tables.RELAY_DEAD_LETTERS])
    ).fetchall()
    return Status(
        schema=schema,
        outbox_rows=int(rows[0]) if rows else 0,
        relays=tuple(relays),
        ledgers=tuple(LedgerPartition(*p) for p in ledgers),
        dead_letters=tuple(DeadLetters(*d) for d in dead),
    )


def with_topic_ends(status: Status, servers: str, timeout: float) -> Status:
    """The sinks' partitions with their high watermarks and LSOs; what Kafka did not answer, said."""
    status = replace(status, kafka=servers)
    if not status.ledgers:
        return status
    admin = AdminClient(client_settings({"bootstrap.servers": servers}, "admin"))
    wanted = sorted({(p.topic, p.partition) for p in status.ledgers})
    high, unanswered = _ends(admin, wanted, IsolationLevel.READ_UNCOMMITTED, timeout)
    stable, _ = _ends(admin, wanted, IsolationLevel.READ_COMMITTED, timeout)
    ledgers = tuple(
        replace(p, high_watermark=high.get((p.topic, p.partition)), stable=stable.get((p.topic, p.partition)))
        for p in status.ledgers
    )
    error = None
    if unanswered:
        (first, why), more = next(iter(unanswered.items())), len(unanswered) - 1
        error = f"Kafka at {servers} gave no end for {first}{f' and {more} more' if more else ''}: {why}"
    return replace(status, ledgers=ledgers, kafka_error=error)


def _ends(
    admin: AdminClient, wanted: list[tuple[str, int]], isolation: IsolationLevel, timeout: float
) -> tuple[dict[tuple[str, int], int], dict[str, str]]:
    """Each partition's end, and why there is none for the others (a topic gone, no leader, no answer)."""
    asked = {TopicPartition(t, p): OffsetSpec.latest() for t, p in wanted}
    ends, unanswered = {}, {}
    try:
        # librdkafka takes at most an hour here
        futures = admin.list_offsets(asked, isolation_level=isolation, request_timeout=min(timeout, 3600))
    except KafkaException as exc:
        return {}, {"every partition": exc.args[0].str()}
    for tp, future in futures.items():
        try:
            offset = future.result().offset
        except KafkaException as exc:
            unanswered[f"{tp.topic}-{tp.partition}"] = exc.args[0].str()
            continue
        if offset < 0:
            unanswered[f"{tp.topic}-{tp.partition}"] = "no leader"
        else:
            ends[(tp.topic, tp.partition)] = offset
    return ends, unanswered
