"""What the sink says when PostgreSQL refuses a row or a batch, on the driver and in the tasks alike.

A refused row's data is at fault (a value the column cannot hold, a broken
constraint, a trigger that raises): it is dead-lettered or, with on_error="fail", fails the batch.
Any other error (a lost connection, a deadlock) belongs to the attempt, not
the row, and is retried.
"""

from __future__ import annotations

import re

import psycopg

from sinks.errors import SinkError

__all__ = ["ROW_ERRORS", "SinkError", "reason"]

# A trigger's RAISE EXCEPTION or failed ASSERT (a table's own validation) refuses the row too.
ROW_ERRORS = (
    psycopg.errors.DataError,
    psycopg.errors.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
    psycopg.errors.RaiseException,
    psycopg.errors.AssertFailure,
)


def reason(exc: psycopg.Error, names: tuple[str, ...] = ()) -> str:
    """PostgreSQL's message, with the stage's column cN named as the table's column."""
    diag = exc.diag
    column = re.search(r"column c(\d+)", diag.context or "")
    where = f" (column {names[int(column[1])]!r})" if column and int(column[1]) < len(names) else ""
    return (diag.message_primary or str(exc).splitlines()[0]) + where
