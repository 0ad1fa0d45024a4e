"""Outbox: rows a logical replica receives are stamped with its own transaction's id too.

The relay reads rows by the id of the transaction that wrote them, in its own
database's snapshots. Logical replication's apply runs with
`session_replication_role = replica`, which skips ordinary triggers, so 0010's
stamp did not run there: a row kept the id of the publisher's transaction,
which means nothing in the subscriber's. A relay on the subscriber (a move to
a new cluster or major version by logical replication, a blue/green cutover)
took such a row for published long ago, never read it, and cleanup deleted it:
lost without a word. The trigger now fires on every insert, the apply's (and
its first copy's) included.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from outbox.migrations import execute, target_schema

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGER = "outbox_events_txid"  # 0010's


def upgrade() -> None:
    _set("ENABLE ALWAYS")


def downgrade() -> None:
    _set("ENABLE")


def _set(how: str) -> None:
    execute(
        sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(
            sql.Identifier(target_schema(), "outbox_events"), sql.SQL(how), sql.Identifier(TRIGGER)
        )
    )
