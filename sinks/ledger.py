"""The sink's progress ledger: the next Kafka offset to apply, per sink and topic-partition.

The sink advances it in the same PostgreSQL transaction as the rows it writes,
so the ledger, not Spark's checkpoint, is the truth about what was applied.
The source reads it to start a query whose checkpoint was lost exactly where
the table stands: nothing replayed, nothing skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from core import tables
from core.config import DatabaseUrl
from core.postgres import connect
from core.sqltext import bindable

Positions = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Ledger:
    """One sink's ledger: where it is (resolved once, when the source's options are parsed) and whose."""

    url: DatabaseUrl
    schema: str
    sink: str

    def positions(self) -> Positions:
        """Next offsets recorded for the sink, per topic-partition."""
        query = bindable(
            sql.SQL("SELECT topic, kafka_partition, next_offset FROM {} WHERE sink = %s").format(
                sql.Identifier(self.schema, tables.SINK_PROGRESS)
            )
        )
        with connect(self.url) as conn:
            try:
                rows = conn.execute(query, [self.sink]).fetchall()
            except psycopg.errors.UndefinedTable:
                raise tables.missing_tables(self.schema, [tables.SINK_PROGRESS], self.url) from None
        return {(t, p): o for t, p, o in rows}
