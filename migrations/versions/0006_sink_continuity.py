"""What a sink needs to notice that PostgreSQL or Kafka went back: the last batch, the topics' ids.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from outbox.migrations import drop_table, target_schema

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    schema = target_schema()
    # The last micro-batch a sink applied, by the Spark query that ran it. Spark's
    # checkpoint moves past a batch once the sink returns; a database that later
    # comes back without the batch's commits (failover to an async replica, a
    # restore, a crash without fsync) shows here a batch older than the one before.
    op.create_table(
        "sink_batches",
        sa.Column("sink", sa.Text, primary_key=True),
        sa.Column("query_id", sa.Text, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=schema,
    )
    # Which topic (Kafka's topic id) a sink's ledger rows are offsets of: a topic
    # deleted and created again under its name starts over at offset 0, and the
    # old ledger rows would skip its records as already applied.
    op.create_table(
        "sink_topics",
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("topic_id", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink", "topic"),
        schema=schema,
    )


def downgrade() -> None:
    drop_table("sink_topics")
    drop_table("sink_batches")
