"""Outbox identity: one random id per outbox (schema of a database), that the relay keys its state by.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outbox.migrations import drop_table, target_schema

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A relay's position is a pair of snapshots of one database: applied to another
    # outbox it skips or repeats rows. Its transactional.id and position key carry
    # this id, so relays of the same name on two schemas or databases never meet.
    table = op.create_table(
        "outbox_identity",
        sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column(
            "id", postgresql.UUID(as_uuid=False), nullable=False, server_default=sa.text("gen_random_uuid()")
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("singleton", name="outbox_identity_one_row"),
        schema=target_schema(),
    )
    op.bulk_insert(table, [{"singleton": True}])


def downgrade() -> None:
    drop_table("outbox_identity")
