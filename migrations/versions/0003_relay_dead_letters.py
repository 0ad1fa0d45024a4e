"""Relay dead letters: outbox rows the relay could not publish, under --on-poison dead-letter.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outbox.migrations import drop_table, target_schema

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A copy of the row, not a reference: cleanup deletes the outbox row once
    # the relay's position has passed it. (relay, outbox_id) is the key, so a
    # relay that crashes after dead-lettering a row and retries it adds no second copy.
    op.create_table(
        "relay_dead_letters",
        sa.Column("relay", sa.Text, nullable=False),
        sa.Column("outbox_id", sa.BigInteger, nullable=False),
        sa.Column("event_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("key", postgresql.BYTEA),
        sa.Column("value", postgresql.BYTEA),
        sa.Column("header_keys", postgresql.ARRAY(sa.Text)),
        sa.Column("header_values", postgresql.ARRAY(postgresql.BYTEA)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("relay", "outbox_id"),
        schema=target_schema(),
    )


def downgrade() -> None:
    drop_table("relay_dead_letters")
