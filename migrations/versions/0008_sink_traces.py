"""What a tracing sink applied, for `outbox trace EVENT_ID`: one row per applying statement.

A row holds, per input record the statement applied or skipped, in parallel
arrays: its topic, partition and offset, its event (its key as text) and its
version; the events of its deletes, of the rows it deleted, and of the rows it
wrote (NULL when it wrote one per upsert, as it does but for duplicates).
Recording a batch costs one row, not one per record, and no index: a trace
reads the arrays instead (outbox/trace/outcomes.py decides each record's
outcome from them). The arrays are stored uncompressed: compressing them
cost the applying statement more than their size costs the disk.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from psycopg import sql
from sqlalchemy.dialects import postgresql

from outbox.migrations import drop_table, execute, target_schema

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


class XID8(sa.types.UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (no SQLAlchemy type exists for it)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "xid8"


def upgrade() -> None:
    schema = target_schema()
    op.create_table(
        "sink_traces",
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("txid", XID8(), nullable=False),
        sa.Column("round", sa.Integer, nullable=False),  # 0: the batch in one statement; else its round
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("outbox_topic", sa.Text),
        sa.Column("topics", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("partitions", postgresql.ARRAY(sa.Integer), nullable=False),
        sa.Column("offsets", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("events", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("versions", postgresql.ARRAY(sa.Text)),
        sa.Column("written", postgresql.ARRAY(sa.Text)),  # NULL: a row for every upsert
        sa.Column("deletes", postgresql.ARRAY(sa.Text), nullable=False),
        sa.Column("removed", postgresql.ARRAY(sa.Text), nullable=False),
        schema=schema,
    )
    for column in ("topics", "partitions", "offsets", "events", "versions", "written", "deletes", "removed"):
        statement = sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE EXTERNAL").format(
            sql.Identifier(schema, "sink_traces"), sql.Identifier(column)
        )
        execute(statement)


def downgrade() -> None:
    drop_table("sink_traces")
