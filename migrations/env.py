"""Alembic environment for the framework's tables.

Our history is kept in its own version table (`outbox_alembic_version`), so it
lives beside an application's own Alembic history in the same database
without either seeing the other's revisions.
"""

from __future__ import annotations

from alembic import context
from psycopg import sql
from sqlalchemy import text

from outbox.core import config as settings
from outbox.migrate import sqlalchemy_engine
from outbox.migrations import FORCE, LOCK_TIMEOUT, VERSION_TABLE, lock_timeout_setting, sql_text

config = context.config
url = config.attributes.get("url") or settings.database_url(
    context.get_x_argument(as_dictionary=True).get("url")
)
schema = config.attributes.get("schema") or settings.schema_name(
    context.get_x_argument(as_dictionary=True).get("schema")
)
options = {
    "version_table": VERSION_TABLE,
    "version_table_schema": schema,
    "target_metadata": None,
    FORCE: bool(config.attributes.get("force")),
}


def run_offline() -> None:
    """Emit SQL for a DBA to review instead of running it (`outbox db upgrade --sql`)."""
    context.configure(dialect_name="postgresql", literal_binds=True, **options)
    with context.begin_transaction():
        context.execute(sql_text(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))))
        context.run_migrations()


def run_online() -> None:
    with sqlalchemy_engine(url).connect() as connection:
        context.configure(connection=connection, **options)
        with context.begin_transaction():
            # Replicas of an app may all upgrade as they deploy: one at a time, the others then
            # find the schema at head. The lock ends with the transaction.
            lock = text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))")
            connection.execute(lock, {"name": f"outbox-migrate:{schema}"})
            # Then each statement waits this long for a table's lock (LOCK_TIMEOUT): a table
            # altered behind a long transaction holds up every write to it meanwhile.
            seconds = float(config.attributes.get("lock_timeout", LOCK_TIMEOUT))
            wait = lock_timeout_setting(seconds)
            connection.execute(text("SELECT set_config('lock_timeout', :wait, true)"), {"wait": wait})
            if not connection.dialect.has_schema(connection, schema):
                connection.execute(sql_text(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema))))
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
