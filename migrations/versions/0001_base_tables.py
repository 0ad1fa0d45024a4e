"""Base tables: outbox events, sink progress ledger, sink dead letters.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outbox.migrations import drop_table, target_schema

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


class XID8(sa.types.UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (no SQLAlchemy type exists for it)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "xid8"


def upgrade() -> None:
    schema = target_schema()

    # Insert-only. `txid` is the writing transaction's id: the relay reads in
    # snapshot deltas over it, so a late-committing row is never skipped.
    op.create_table(
        "outbox_events",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("txid", XID8(), nullable=False, server_default=sa.text("pg_current_xact_id()")),
        sa.Column("event_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("key", postgresql.BYTEA),
        sa.Column("value", postgresql.BYTEA),
        sa.Column("header_keys", postgresql.ARRAY(sa.Text)),
        sa.Column("header_values", postgresql.ARRAY(postgresql.BYTEA)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=schema,
    )
    op.create_index("outbox_events_txid_idx", "outbox_events", ["txid"], schema=schema)

    # Exactly-once progress of a sink: the next offset to apply per
    # topic-partition, written in the same transaction as the sink's rows.
    op.create_table(
        "sink_progress",
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("sink", "topic", "kafka_partition"),
        schema=schema,
    )

    # Rows a sink could not write, kept with their source position and error.
    op.create_table(
        "sink_dead_letters",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("topic", sa.Text),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.Column("key", postgresql.BYTEA),
        sa.Column("value", postgresql.BYTEA),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=schema,
    )
    op.create_index("sink_dead_letters_sink_idx", "sink_dead_letters", ["sink", "failed_at"], schema=schema)


def downgrade() -> None:
    drop_table("sink_dead_letters")
    drop_table("sink_progress")
    drop_table("outbox_events")
