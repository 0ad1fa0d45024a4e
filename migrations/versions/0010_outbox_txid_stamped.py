"""Outbox: each row's `txid` is the id of the transaction that inserts it, whatever the INSERT says.

The relay reads rows by the transaction that wrote them. An INSERT that set
`txid` itself (a copy of another row, an ORM writing every column) made a row
the relay took for published long ago, which cleanup then deleted, or one it
would not read for a billion transactions: lost without a word. A trigger now
stamps every inserted row, as the column's default did. It runs after a
restore's data (pg_dump puts triggers after it), so a restored outbox keeps
its ids until `outbox relay rebase`, and not on a logical replica's apply.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER = "outbox_events_txid"


def upgrade() -> None:
    names = {
        "table": sql.Identifier(target_schema(), "outbox_events"),
        "stamp": sql.Identifier(target_schema(), TRIGGER),
        "trigger": sql.Identifier(TRIGGER),
    }
    execute(
        sql.SQL(
            "CREATE FUNCTION {stamp}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN NEW.txid := pg_current_xact_id(); RETURN NEW; END $$"
        ).format(**names)
    )
    execute(
        sql.SQL(
            "CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {stamp}()"
        ).format(**names)
    )


def downgrade() -> None:
    table = sql.Identifier(target_schema(), "outbox_events")
    execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(TRIGGER), table))
    execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(target_schema(), TRIGGER)))
