"""Run the framework's Alembic migrations against a database and schema.

The CLI (`outbox db ...`), the demo and the tests all come through here, so
they migrate exactly the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TextIO

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, create_engine, pool

from outbox.core.config import DatabaseUrl
from outbox.core.postgres import connect, reason
from outbox.core.probe import check_postgres
from outbox.errors import error
from outbox.migrations import LOCK_TIMEOUT, VERSION_TABLE


def script_location() -> Path:
    return Path(str(files("outbox.migrations")))


def alembic_config(
    url: DatabaseUrl,
    schema: str,
    stdout: TextIO | None = None,
    *,
    force: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
) -> Config:
    """force: a downgrade drops tables that hold rows too (outbox.migrations.drop_table);
    lock_timeout: seconds a statement waits for a table's lock."""
    cfg = Config(stdout=stdout) if stdout else Config()
    cfg.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    cfg.attributes["url"] = url
    cfg.attributes["schema"] = schema
    cfg.attributes["force"] = force
    cfg.attributes["lock_timeout"] = lock_timeout
    return cfg


@dataclass(frozen=True)
class Revisions:
    current: tuple[str, ...]
    head: str

    @property
    def up_to_date(self) -> bool:
        return self.current == (self.head,)


def upgrade(
    url: DatabaseUrl,
    schema: str,
    revision: str = "head",
    *,
    sql: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
) -> None:
    _run(command.upgrade, url, schema, revision, sql=sql, lock_timeout=lock_timeout)


def downgrade(
    url: DatabaseUrl,
    schema: str,
    revision: str,
    *,
    sql: bool = False,
    force: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
) -> None:
    """force: drop tables that hold rows too; else such a downgrade is refused, and drops nothing."""
    if sql and ":" not in revision:
        raise error("DB_DOWNGRADE_SQL_NEEDS_RANGE")
    _run(command.downgrade, url, schema, revision, sql=sql, force=force, lock_timeout=lock_timeout)


def sqlalchemy_engine(url: DatabaseUrl) -> Engine:
    """SQLAlchemy over libpq's own connection: libpq reads the URL (several hosts for a failover
    setup, a socket directory), where SQLAlchemy's reading of it differs."""
    return create_engine("postgresql+psycopg://", creator=lambda: connect(url), poolclass=pool.NullPool)


def revisions(url: DatabaseUrl, schema: str) -> Revisions:
    check_postgres(url)
    head = ScriptDirectory.from_config(alembic_config(url, schema)).get_current_head()
    engine = sqlalchemy_engine(url)
    try:
        with _reported(url, "DB_REVISION_UNREADABLE", schema=schema), engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema}
            )
            current = tuple(ctx.get_current_heads())
    finally:
        engine.dispose()
    return Revisions(current=current, head=str(head))


def _run(
    fn: Callable[..., None],
    url: DatabaseUrl,
    schema: str,
    revision: str,
    *,
    sql: bool,
    force: bool = False,
    lock_timeout: float = LOCK_TIMEOUT,
) -> None:
    if not sql:
        check_postgres(url)
    config = alembic_config(url, schema, force=force, lock_timeout=lock_timeout)
    with _reported(url, "DB_REVISION_FAILED", revision=revision, schema=schema, lock_timeout=lock_timeout):
        fn(config, revision, sql=sql)


@contextmanager
def _reported(
    url: DatabaseUrl, code: str, lock_timeout: float | None = None, **fields: object
) -> Iterator[None]:
    """Alembic's and the database's errors as one line: `code`, with the database's reason."""
    try:
        yield
    except CommandError as exc:
        raise error("DB_MIGRATION_FAILED", reason=url.scrub(str(exc))) from None
    except Exception as exc:  # a database error (a revision's, or reading the version table)
        if lock_timeout is not None and isinstance(
            getattr(exc, "orig", exc), psycopg.errors.LockNotAvailable
        ):
            raise error("DB_LOCK_TIMEOUT", schema=fields["schema"], seconds=lock_timeout) from None
        if type(exc).__module__.startswith(("sqlalchemy", "psycopg")):
            raise error(code, reason=reason(exc, url), **fields) from None
        raise
