"""What a sink's last batch did, where any client can read it: a Spark Connect client holds no
batch function of its own, so `sink.last` reads it here.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outbox.migrations import target_schema

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The batch's counts and times (BatchResult), written once it committed; NULL until then.
    op.add_column(
        "sink_batches", sa.Column("result", postgresql.JSONB, nullable=True), schema=target_schema()
    )


def downgrade() -> None:
    op.drop_column("sink_batches", "result", schema=target_schema())
