"""Outbox: NOTIFY on insert for a low-latency relay; rows can no longer be updated.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The relay LISTENs here; the payload is the schema, so one channel serves every schema.
CHANNEL = "outbox_events"


def upgrade() -> None:
    names = {
        "table": sql.Identifier(target_schema(), "outbox_events"),
        "notify": sql.Identifier(target_schema(), "outbox_events_notify"),
        "frozen": sql.Identifier(target_schema(), "outbox_events_insert_only"),
        "channel": sql.Literal(CHANNEL),
    }
    # One notification per inserting statement, delivered at commit (none for a rollback).
    execute(
        sql.SQL(
            "CREATE FUNCTION {notify}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN PERFORM pg_notify({channel}, TG_TABLE_SCHEMA); RETURN NULL; END $$"
        ).format(**names)
    )
    execute(
        sql.SQL(
            "CREATE TRIGGER outbox_events_notify AFTER INSERT ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION {notify}()"
        ).format(**names)
    )
    # Published rows are only ever deleted (cleanup); an update would rewrite history.
    execute(
        sql.SQL(
            "CREATE FUNCTION {frozen}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'outbox_events is insert-only: add a new event instead of updating one';"
            " END $$"
        ).format(**names)
    )
    execute(
        sql.SQL(
            "CREATE TRIGGER outbox_events_insert_only BEFORE UPDATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION {frozen}()"
        ).format(**names)
    )


def downgrade() -> None:
    table = sql.Identifier(target_schema(), "outbox_events")
    for trigger in ("outbox_events_insert_only", "outbox_events_notify"):
        execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), table))
        execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier(target_schema(), trigger)))
