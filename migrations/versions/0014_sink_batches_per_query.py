"""A sink's last batch, by each query that wrote it, not only the latest query.

With one row a sink, the check that PostgreSQL still holds the batch before
(sinks/postgres/continuity.py) had nothing to compare once the row was another
query's: a new checkpoint applied its batch 0, a restore brought the old
query's row back, and the new query's batch 1 went on past batch 0's events.
Kept by query, a query at batch N > 0 with no row of its own is one whose
batches PostgreSQL no longer holds (or a checkpoint moved onto the sink, which
`outbox sinks adopt` records).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = "sink_batches_pkey"


def upgrade() -> None:
    table = sql.Identifier(target_schema(), "sink_batches")
    execute(
        sql.SQL(
            "ALTER TABLE {table} DROP CONSTRAINT {key}, ADD CONSTRAINT {key} PRIMARY KEY (sink, query_id)"
        ).format(table=table, key=sql.Identifier(KEY))
    )


def downgrade() -> None:
    """Back to one row a sink: its latest query's."""
    table = sql.Identifier(target_schema(), "sink_batches")
    execute(
        sql.SQL(
            "DELETE FROM {table} b WHERE EXISTS (SELECT FROM {table} n WHERE n.sink = b.sink"
            " AND (n.updated_at, n.query_id) > (b.updated_at, b.query_id))"
        ).format(table=table)
    )
    execute(
        sql.SQL("ALTER TABLE {table} DROP CONSTRAINT {key}, ADD CONSTRAINT {key} PRIMARY KEY (sink)").format(
            table=table, key=sql.Identifier(KEY)
        )
    )
