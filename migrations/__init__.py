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
