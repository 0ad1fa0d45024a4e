"""Outbox: the NOTIFY on insert can be turned off with the setting outbox.notify, for two-phase commit.

PostgreSQL refuses to PREPARE a transaction that sent a NOTIFY (PREPARE
TRANSACTION, which XA transaction managers and SQLAlchemy's twophase use), so
with 0002's trigger no such transaction could add an event. With
`outbox.notify = off` (SET LOCAL in the transaction, or ALTER ROLE/DATABASE
... SET) its inserts send none; the relay finds their events at its poll
interval. Any other value than a boolean is refused, so a typo is not taken
for "on".

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.core.tables import NOTIFY_SETTING
from outbox.migrations import execute, target_schema

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "outbox_events"  # as in 0002: the relay LISTENs here, the payload is the schema


def _notify(body: str) -> None:
    function = sql.Identifier(target_schema(), "outbox_events_notify")
    statement = sql.SQL(
        "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ {} $$"
    ).format(function, sql.SQL(body))
    execute(statement)


def upgrade() -> None:
    setting, channel = (sql.Literal(v).as_string(None) for v in (NOTIFY_SETTING, CHANNEL))
    # Read as PostgreSQL reads a boolean; the subtransaction of the inner block only when it is set.
    _notify(
        f"DECLARE wanted text := current_setting({setting}, true); notify boolean := true;"
        f" BEGIN"
        f" IF wanted <> '' THEN"
        f"  BEGIN notify := wanted::boolean;"
        f"  EXCEPTION WHEN invalid_text_representation THEN"
        f"   RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',"
        f"    MESSAGE = {setting} || ' is ' || quote_literal(wanted) || ': set it to on or off';"
        f"  END;"
        f" END IF;"
        f" IF notify THEN PERFORM pg_notify({channel}, TG_TABLE_SCHEMA); END IF;"
        f" RETURN NULL; END"
    )


def downgrade() -> None:
    channel = sql.Literal(CHANNEL).as_string(None)
    _notify(f"BEGIN PERFORM pg_notify({channel}, TG_TABLE_SCHEMA); RETURN NULL; END")
