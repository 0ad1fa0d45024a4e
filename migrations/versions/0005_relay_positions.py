"""Relay positions as PostgreSQL durably knows them: what makes a rewound database visible.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from outbox.migrations import drop_table, target_schema

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A relay's position lives in Kafka; its snapshots are of this database. Before
    # a relay commits a position to Kafka it commits (synchronously) the snapshot
    # it read here, numbered by `mark`: a database that comes back without that
    # mark (crash without fsync, failover to an async replica, restore) has lost
    # transactions, may hand their xids out again, and the relay republishes from
    # `base`, the last snapshot this database knows was published. Other relays'
    # `base` also bounds what cleanup may delete.
    op.create_table(
        "relay_positions",
        sa.Column("relay", sa.Text, nullable=False),
        sa.Column("shard", sa.Integer, nullable=False),
        sa.Column("shards", sa.Integer, nullable=False),
        sa.Column("base", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("mark", sa.BigInteger, nullable=False),
        sa.Column("system_identifier", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("relay", "shard", "shards"),
        schema=target_schema(),
    )


def downgrade() -> None:
    drop_table("relay_positions")
