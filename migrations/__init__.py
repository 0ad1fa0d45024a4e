"""The framework's own Alembic environment (shipped as `outbox.migrations`).

Revisions create tables in the schema chosen at run time (`outbox db upgrade
--schema`), so they ask for it here instead of hard-coding one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from psycopg.sql import Composable

if TYPE_CHECKING:
    from sqlalchemy import TextClause

VERSION_TABLE = "outbox_alembic_version"
# How long a migration waits for a table's lock. A table it alters waits for every transaction that
# has read it, and every write to the table queues behind the waiting ALTER: the application's.
LOCK_TIMEOUT = 5.0


def lock_timeout_setting(seconds: float) -> str:
    """PostgreSQL's `lock_timeout` for `seconds`: milliseconds, at least 1 (0 would wait for ever)
    and at most PostgreSQL's most."""
    return f"{min(max(seconds * 1000, 1), 2**31 - 1):.0f}ms"


def sql_text(statement: Composable) -> TextClause:
    """SQL composed with psycopg.sql (names quoted there) as SQLAlchemy runs it. SQLAlchemy reads a
    ':' in a name (a schema called ':x') as a bind parameter; escaped, each one stays a ':'."""
    from sqlalchemy import text

    return text(statement.as_string(None).replace(":", "\\:"))


def execute(statement: Composable) -> None:
    from alembic import op

    op.execute(sql_text(statement))


def target_schema() -> str:
    """The schema this run migrates; the version table lives there too. A name Alembic quotes
    whole: as a plain str it splits one at each '.' (for database.schema), and a schema called
    '.' or 'a.b' failed at the first add_column."""
    from alembic import op
    from sqlalchemy.sql.elements import quoted_name

    return quoted_name(str(op.get_context().opts["version_table_schema"]), quote=True)


# Tables whose rows a downgrade must not drop unasked: events not yet published, ledgers, positions,
# and dead letters (their only copy). outbox_identity is not one: its row is the migration's own.
KEPT = frozenset(
    {
        "outbox_events",
        "sink_progress",
        "sink_dead_letters",
        "relay_dead_letters",
        "relay_positions",
        "sink_batches",
        "sink_topics",
        "sink_traces",
    }
)
FORCE = "outbox_force"  # the MigrationContext option `outbox db downgrade --force` sets


def drop_table(name: str) -> None:
    """op.drop_table, refused while a KEPT table holds rows and the run is not forced. The
    revisions of one run share a transaction, so a refusal drops nothing at all."""
    from alembic import op
    from psycopg import sql

    from outbox.errors import error

    schema, context = target_schema(), op.get_context()
    if name == "outbox_events" and not context.as_sql:
        from shlex import quote

        from outbox.debezium import adopters

        if found := op.get_bind().execute(sql_text(adopters(schema))).all():
            first = found[0]
            raise error(
                "DB_DOWNGRADE_ADOPTED",
                tables=", ".join(f"{s}.{t}" for s, t in found),
                schema=schema,
                undo=f"outbox db adopt-debezium {quote(first[1])} --table-schema {quote(first[0])} --undo",
            )
    if name in KEPT and not context.as_sql and not context.opts.get(FORCE):
        rows = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(sql.Identifier(schema, name))
        if op.get_bind().execute(sql_text(rows)).scalar():
            raise error("DB_DOWNGRADE_WOULD_DROP_ROWS", table=f"{schema}.{name}")
    op.drop_table(name, schema=schema)
