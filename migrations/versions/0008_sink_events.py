"""What a tracing sink did with each input record, for `outbox trace EVENT_ID`.

One row per record the sink applied or skipped, written in the transaction
that applied it: the event (md5 of its key as text, as a uuid, so the one
index compares 16 bytes), where it came from, the outcome, its version, the
transaction (whose outbox rows the relay publishes) and the outbox topic.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from outbox.migrations import target_schema
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


class XID8(sa.types.UserDefinedType[int]):
    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "xid8"


def upgrade() -> None:
    schema = target_schema()
    op.create_table(
        "sink_events",
        sa.Column("event", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("version", sa.Text),
        sa.Column("txid", XID8(), nullable=False),
        sa.Column("outbox_topic", sa.Text),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=schema,
    )
    # No primary key: the ledger already lets each record in once; the one index is the lookup's.
    op.create_index("sink_events_event", "sink_events", ["event"], schema=schema)


def downgrade() -> None:
    op.drop_table("sink_events", schema=target_schema())
