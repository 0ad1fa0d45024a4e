"""Outbox: a row's id is above 0, the first id the relay reads.

The relay reads a delta along the primary key from past id 0. A row an INSERT
gave an id at or below 0 (OVERRIDING SYSTEM VALUE; a copy from another table)
was never read, then deleted by cleanup: lost without a word. The table now
refuses it. NOT VALID: rows already there are not scanned, so the upgrade takes
its lock for an instant, not for a scan of a large outbox.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CONSTRAINT = "outbox_events_id_positive"


def upgrade() -> None:
    execute(
        sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (id > 0) NOT VALID").format(
            sql.Identifier(target_schema(), "outbox_events"), sql.Identifier(CONSTRAINT)
        )
    )


def downgrade() -> None:
    execute(
        sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
            sql.Identifier(target_schema(), "outbox_events"), sql.Identifier(CONSTRAINT)
        )
    )
