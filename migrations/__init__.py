"""The framework's own Alembic environment (shipped as `outbox.migrations`).

Revisions create tables in the schema chosen at run time (`outbox db upgrade
--schema`), so they ask for it here instead of hard-coding one.
"""

from __future__ import annotations

VERSION_TABLE = "outbox_alembic_version"


def target_schema() -> str:
    """The schema this run migrates; the version table lives there too."""
    from alembic import op

    return str(op.get_context().opts["version_table_schema"])


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
    from sqlalchemy import text

    from outbox.errors import error

    schema, context = target_schema(), op.get_context()
    if name in KEPT and not context.as_sql and not context.opts.get(FORCE):
        preparer = context.dialect.identifier_preparer
        table = f"{preparer.quote_identifier(schema)}.{preparer.quote_identifier(name)}"
        if op.get_bind().execute(text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar():
            raise error("DB_DOWNGRADE_WOULD_DROP_ROWS", table=f"{schema}.{name}")
    op.drop_table(name, schema=schema)
