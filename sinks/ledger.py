"""The sink's progress ledger: the next Kafka offset to apply, per sink and topic-partition.

The sink advances it in the same PostgreSQL transaction as the rows it writes,
so the ledger, not Spark's checkpoint, is the truth about what was applied.
The source reads it to start a query whose checkpoint was lost exactly where
the table stands: nothing replayed, nothing skipped.

Offsets name records only within one topic: the ledger also keeps, per topic,
the Kafka topic id its offsets are of (`sink_topics`). A topic deleted and
created again under its name has another id; its old offsets must not skip
the new topic's records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError
from outbox.core.postgres import connect
from outbox.core.sqltext import bindable
from sinks.errors import error

Positions = dict[tuple[str, int], int]


def positions(conn: psycopg.Connection[Any], schema: str, sink: str) -> Positions:
    """Next offsets recorded for the sink, per topic-partition."""
    query = sql.SQL("SELECT topic, kafka_partition, next_offset FROM {} WHERE sink = %s")
    rows = conn.execute(bindable(query.format(sql.Identifier(schema, tables.SINK_PROGRESS))), [sink])
    return {(t, p): o for t, p, o in rows}


def topic_ids(conn: psycopg.Connection[Any], schema: str, sink: str) -> dict[str, str]:
    """The Kafka topic id each of the sink's ledger topics was recorded under."""
    query = sql.SQL("SELECT topic, topic_id FROM {} WHERE sink = %s")
    return dict(conn.execute(bindable(query.format(sql.Identifier(schema, tables.SINK_TOPICS))), [sink]))


def recreated(recorded: Mapping[str, str], ids: Mapping[str, str]) -> list[str]:
    """Topics that exist now under another id than the ledger's offsets were recorded under."""
    return sorted(t for t, i in ids.items() if recorded.get(t, i) != i)


def recreated_error(sink: str, topic: str, recorded: str, now: str) -> OutboxError:
    return error("SINK_TOPIC_RECREATED", topic=topic, sink=sink, was=recorded, now=now)


@dataclass(frozen=True)
class Ledger:
    """One sink's ledger: where it is (resolved once, when the source's options are parsed) and whose."""

    url: DatabaseUrl
    schema: str
    sink: str

    def read(self) -> tuple[Positions, dict[str, str]]:
        """Next offsets per topic-partition, and the topic ids they are of."""
        with connect(self.url) as conn:
            try:
                return positions(conn, self.schema, self.sink), topic_ids(conn, self.schema, self.sink)
            except psycopg.errors.UndefinedTable:
                raise tables.missing_tables(
                    self.schema, [tables.SINK_PROGRESS, tables.SINK_TOPICS], self.url
                ) from None
