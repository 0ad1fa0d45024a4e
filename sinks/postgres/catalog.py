"""What PostgreSQL says about the target table: columns, types, unique keys."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from sinks.errors import error


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as format_type() prints it, e.g. "numeric(12,2)"
    category: str  # pg_type.typcategory: A array, B bool, D datetime, N numeric, S string, U other...
    base: str  # pg_type.typname, e.g. "uuid", "jsonb", "_int4"
    element_category: str | None  # for arrays
    not_null: bool
    has_default: bool
    generated: bool
    deterministic: bool = (
        True  # its collation's `=` is byte equality (not so for ICU's case-insensitive ones)
    )


@dataclass(frozen=True)
class Table:
    schema: str
    name: str
    columns: dict[str, Column]
    unique_keys: tuple[frozenset[str], ...]


_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory, t.typname, et.typcategory,
       a.attnotnull, a.atthasdef OR a.attidentity <> '', a.attgenerated <> '' OR a.attidentity = 'a',
       coalesce(co.collisdeterministic, true)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A'
LEFT JOIN pg_collation co ON co.oid = a.attcollation
WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

# The unique indexes ON CONFLICT can infer: immediate (not deferrable) and valid; over their key
# columns only (an INCLUDE column is no part of the key).
_UNIQUE = """
SELECT array_agg(a.attname::text)
FROM pg_index i
JOIN pg_class c ON c.oid = i.indrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1])
WHERE n.nspname = %s AND c.relname = %s AND i.indisunique AND i.indimmediate AND i.indisvalid
  AND i.indpred IS NULL AND i.indexprs IS NULL
GROUP BY i.indexrelid
"""


def describe(conn: psycopg.Connection, schema: str, table: str) -> Table:
    found = find(conn, schema, table)
    if found is None:
        raise error("SINK_TABLE_NOT_FOUND", schema=schema, table=table, database=conn.info.dbname)
    return found


def find(conn: psycopg.Connection, schema: str, table: str) -> Table | None:
    """The table's catalog entry; None where there is no such table."""
    rows = conn.execute(_COLUMNS, [schema, table]).fetchall()
    if not rows:
        return None
    columns = {r[0]: Column(*r) for r in rows}
    keys = tuple(frozenset(r[0]) for r in conn.execute(_UNIQUE, [schema, table]).fetchall())
    return Table(schema, table, columns, keys)
