"""Statements that name user objects and also take parameters.

psycopg reads `%` as the start of a placeholder anywhere in a query that is
run with parameters, quoted names and string literals included, so a table
`50% off` or a column `note %s` breaks such a statement. `bindable` doubles
every `%` inside names and literals (psycopg turns `%%` back into `%`) and
leaves the statement's own placeholders alone. A statement passed through it
must be run with parameters (an empty dict will do).
"""

from __future__ import annotations

from psycopg import sql

# What psycopg runs: a statement text, or one composed of parts.
Query = sql.SQL | sql.Composed


def bindable(query: sql.Composable) -> sql.Composed:
    return sql.Composed([_escaped(query)])


def _escaped(query: sql.Composable) -> sql.Composable:
    if isinstance(query, sql.Composed):
        return sql.Composed([_escaped(part) for part in query])
    if isinstance(query, sql.Identifier | sql.Literal):
        return sql.SQL(query.as_string(None).replace("%", "%%"))
    return query


def user_sql(text: str) -> sql.SQL:
    """A SQL expression the user wrote (e.g. `note LIKE '%x'`), fit for a statement with parameters."""
    return sql.SQL(text.replace("%", "%%"))
