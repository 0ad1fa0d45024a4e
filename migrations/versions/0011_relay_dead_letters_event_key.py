"""Relay: a dead letter is known by its row's id and its event's id, not by the row's id alone.

The relay leaves dead-lettered rows out of its reads. Known by the outbox row's
id alone, a dead letter stood for whichever row took that id next: ids start
again after TRUNCATE ... RESTART IDENTITY, or in a database a logical
replication move filled (it copies no sequence), and the new event with a dead
letter's id was never read, then deleted by cleanup. The key is now (relay,
outbox_id, event_id); the reads compare both ids.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _key(*columns: str) -> None:
    table = sql.Identifier(target_schema(), "relay_dead_letters")
    execute(
        sql.SQL("ALTER TABLE {} DROP CONSTRAINT relay_dead_letters_pkey, ADD PRIMARY KEY ({})").format(
            table, sql.SQL(", ").join(map(sql.Identifier, columns))
        )
    )


def upgrade() -> None:
    _key("relay", "outbox_id", "event_id")


def downgrade() -> None:
    _key("relay", "outbox_id")  # refused while two dead letters share a relay and a row id
