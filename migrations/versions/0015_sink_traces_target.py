"""The table each traced statement applied to: a routed sink's lanes share its name.

A routed sink applies each of its tables in a statement of its own, under the
sink's name, in one transaction and round. The outbox event a tracing sink
writes for a row takes an id derived from the sink, the transaction, the round
and the row's key: two tables' rows of one key in one batch took one id. The id
now takes the table too, and each trace row says which table it applied to, so
`outbox trace` computes the id again. Rows written before have none (NULL), and
their ids are computed as they were made.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from outbox.migrations import target_schema

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sink_traces", sa.Column("target", sa.Text), schema=target_schema())


def downgrade() -> None:
    op.drop_column("sink_traces", "target", schema=target_schema())
