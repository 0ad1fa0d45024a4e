"""Which topics the sink's ledger offsets are of, checked with Kafka before every batch.

A topic deleted and created again under its name starts over at offset 0, and
a truncated log (an unclean leader election) writes new records at offsets
already applied: either way the ledger would skip them as applied. The sink
keeps each topic's Kafka topic id beside its offsets and compares it, and the
ledger's offsets with the log's ends, before it applies a batch. With the
source's failOnDataLoss (true by default) a difference stops the query with
one line; with failOnDataLoss=false the sink forgets the offsets of a topic
created again, moves a truncated partition's back to its log's end (the prefix
Kafka kept was applied, and stays guarded), logs it, and goes on, as the
source does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from psycopg import sql

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError
from outbox.core.postgres import connect
from outbox.core.sqltext import bindable
from sinks.errors import error
from sinks.kafka_source.cluster import Cluster
from sinks.kafka_source.options import SourceOptions, parse
from sinks.ledger import Positions, positions, recreated, recreated_error, topic_ids
from sinks.postgres.placement import Node

log = logging.getLogger("sinks.postgres")

# What librdkafka understands of Spark's kafka source's (Java client) settings.
_SHARED_SETTINGS = ("security.protocol", "sasl.mechanism")


@dataclass(frozen=True)
class Verdict:
    """What the ledger must forget, what ids to record, and the losses to report."""

    topics: tuple[str, ...] = ()  # created again: forget all their offsets
    partitions: tuple[tuple[str, int, int], ...] = ()  # truncated: (topic, partition, the log's end now)
    record: dict[str, str] = field(default_factory=dict)
    losses: tuple[OutboxError, ...] = ()


def judge(
    sink: str,
    recorded: Mapping[str, str],
    ids: Mapping[str, str],
    ledger: Positions,
    ends: Mapping[tuple[str, int], int],
) -> Verdict:
    """Compare the ledger (offsets, topic ids) with Kafka now (ids, log ends)."""
    again = recreated(recorded, ids)
    truncated = sorted(tp for tp, o in ledger.items() if tp[0] not in again and tp in ends and o > ends[tp])
    losses = [recreated_error(sink, t, recorded[t], ids[t]) for t in again] + [
        error("SINK_LOG_TRUNCATED", topic=t, partition=p, end=ends[t, p], sink=sink, offset=ledger[t, p])
        for t, p in truncated
    ]
    record = {t: i for t, i in ids.items() if recorded.get(t) != i}
    return Verdict(tuple(again), tuple((t, p, ends[t, p]) for t, p in truncated), record, tuple(losses))


def sources(root: Node | None, kafka: Mapping[str, str]) -> list[SourceOptions]:
    """Each Kafka source of the frame (a union has several) as librdkafka settings, `kafka` over its own.

    Refuses any of Spark's own Kafka sources left at its default isolation,
    read_uncommitted: the sink would apply aborted records, not the user's choice.
    """
    nodes = [n for n in _nodes(root) if n.source in ("kafka_rc", "kafka")]
    if any(n.source == "kafka" and "kafka.isolation.level" not in n.options for n in nodes):
        raise error("SINK_ISOLATION_UNSET")
    return [_source(n.source, n.options, kafka) for n in nodes]


def _source(source: str | None, opts: Mapping[str, str], kafka: Mapping[str, str]) -> SourceOptions:
    if source == "kafka_rc":
        found = parse(opts)
        return replace(found, kafka={**found.kafka, **kafka})
    assigned = tuple(json.loads(opts["assign"])) if "assign" in opts else ()
    topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip()) or assigned
    shared = {k: opts[f"kafka.{k}"] for k in _SHARED_SETTINGS if f"kafka.{k}" in opts}
    return SourceOptions(
        bootstrap_servers=opts["kafka.bootstrap.servers"],
        topics=topics,
        pattern=opts.get("subscribepattern"),
        fail_on_data_loss=opts.get("failondataloss", "true").lower() != "false",
        # Spark's source reads uncommitted unless told: the ledger may then be past the LSO.
        read_uncommitted=opts.get("kafka.isolation.level", "read_uncommitted") != "read_committed",
        kafka={**shared, **kafka},
    )


def _database(conn: psycopg.Connection[Any]) -> tuple[str, str]:
    """Which database a connection reached: its server's system identifier and its name."""
    row = conn.execute(
        "SELECT system_identifier::text, current_database() FROM pg_control_system()"
    ).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def _said(database: tuple[str, str]) -> str:
    return f"database {database[1]!r} of server {database[0]}"


def _nodes(root: Node | None) -> Iterator[Node]:
    if root is not None:
        yield root
        for child in root.children:
            yield from _nodes(child)


class TopicCheck:
    """The check of one sink's ledger against the frame's Kafka source, run before each batch."""

    def __init__(self, root: Node | None, kafka: Mapping[str, str], sink: str, schema: str) -> None:
        self.sources, self.sink, self.schema = sources(root, kafka), sink, schema
        for ledger in (s.ledger for s in self.sources if s.ledger is not None):
            if (ledger.sink, ledger.schema) != (sink, schema):
                raise error(
                    "SINK_LEDGER_OTHER_SINK",
                    source=ledger.sink,
                    source_schema=ledger.schema,
                    sink=sink,
                    schema=schema,
                )
        # Kafka is asked with the first source's settings: a union's sources share a cluster.
        self.options = self.sources[0] if self.sources else None
        self.cluster = Cluster(self.options) if self.options else None

    def check_ledgers(self, url: DatabaseUrl) -> None:
        """Refuse a kafka_rc source that reads its ledger from another database than the sink's `url`:
        the same server (its system identifier, which a streaming replica shares) and database name,
        whatever the URL's spelling."""
        others = sorted({s.ledger.url for s in self.sources if s.ledger and s.ledger.url != url}, key=str)
        if not others:
            return
        with connect(url) as conn:
            here = _database(conn)
        for ledger in others:
            with connect(ledger) as conn:
                there = _database(conn)
            if there != here:
                raise error(
                    "SINK_LEDGER_OTHER_DATABASE",
                    ledger=ledger.safe,
                    there=_said(there),
                    url=url.safe,
                    here=_said(here),
                )

    def __call__(self, conn: psycopg.Connection[Any]) -> None:
        if self.cluster is None or self.options is None:
            return
        subscribed = {t for source in self.sources for t in source.topics}
        if any(source.pattern is not None for source in self.sources):
            subscribed |= {t for t in self.cluster.topics() if any(s.matches(t) for s in self.sources)}
        # Only the topics read now: a topic the query left may be made again under its name for
        # another use, and is checked when a query reads it again.
        ledger = {tp: o for tp, o in positions(conn, self.schema, self.sink).items() if tp[0] in subscribed}
        recorded = topic_ids(conn, self.schema, self.sink)
        ids = self.cluster.topic_ids(subscribed)
        kept = [tp for tp in ledger if ids.get(tp[0], "") == recorded.get(tp[0])]
        # A partition without a leader has no end to compare: kafka_rc reads around it, and it is
        # checked before the batch that reads it again.
        ends = self.cluster.log_ends({tp: ledger[tp] for tp in kept}, self.cluster.latest(kept, partial=True))
        verdict = judge(self.sink, recorded, ids, ledger, ends)
        if verdict.losses and self.options.fail_on_data_loss:
            raise verdict.losses[0]
        for loss in verdict.losses:
            log.warning("%s; going on (failOnDataLoss=false)", loss.message.split(". To apply")[0])
        if verdict.record or verdict.topics or verdict.partitions:
            with conn.transaction():
                self._write(conn, verdict)

    def _write(self, conn: psycopg.Connection[Any], verdict: Verdict) -> None:
        progress = sql.Identifier(self.schema, tables.SINK_PROGRESS)
        topics, partitions, offsets = [list(c) for c in zip(*verdict.partitions, strict=True)] or [[], [], []]
        names = sql.Identifier(self.schema, tables.SINK_TOPICS)
        conn.execute(
            bindable(sql.SQL("DELETE FROM {} WHERE sink = %s AND topic = ANY(%s)").format(progress)),
            [self.sink, list(verdict.topics)],
        )
        conn.execute(
            bindable(
                sql.SQL(
                    "UPDATE {} AS g SET next_offset = least(g.next_offset, e.o), updated_at = now()"
                    " FROM unnest(%(t)s::text[], %(p)s::int[], %(o)s::bigint[]) AS e (t, p, o)"
                    " WHERE g.sink = %(sink)s AND g.topic = e.t AND g.kafka_partition = e.p"
                ).format(progress)
            ),
            {"sink": self.sink, "t": topics, "p": partitions, "o": offsets},
        )
        conn.execute(
            bindable(
                sql.SQL(
                    "INSERT INTO {} AS n (sink, topic, topic_id) SELECT %(sink)s, t, i"
                    " FROM unnest(%(t)s::text[], %(i)s::text[]) AS r (t, i) ON CONFLICT (sink, topic)"
                    " DO UPDATE SET topic_id = EXCLUDED.topic_id, updated_at = now()"
                ).format(names)
            ),
            {"sink": self.sink, "t": list(verdict.record), "i": list(verdict.record.values())},
        )
