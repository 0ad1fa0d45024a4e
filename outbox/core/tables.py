"""The framework's own tables, as the running code sees them (migrations keep their frozen literals).

`outbox db upgrade --schema S` creates them all in S; whoever needs one
checks for it with `require` and tells the user that same remedy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError, error

OUTBOX_EVENTS = "outbox_events"
OUTBOX_IDENTITY = "outbox_identity"
RELAY_DEAD_LETTERS = "relay_dead_letters"
RELAY_POSITIONS = "relay_positions"
SINK_PROGRESS = "sink_progress"
SINK_BATCHES = "sink_batches"
SINK_TOPICS = "sink_topics"
SINK_DEAD_LETTERS = "sink_dead_letters"
SINK_TRACES = "sink_traces"  # what a tracing sink applied, per statement (outbox/core/trace.py)
SINK_STAGE_PREFIX = "sink_stage_"  # + a digest of the sink's name: one staged batch's rows
TXID_TRIGGER = "outbox_events_txid"  # stamps each outbox row's txid (0010), on a replica's apply too (0013)

# Columns that later revisions added to a table: whoever requires the table needs them too.
ADDED_COLUMNS = {SINK_BATCHES: ("result",), SINK_TRACES: ("target",)}
# Primary keys that later revisions changed (0014: a sink's batches by query), as they are now.
CHANGED_KEYS = {SINK_BATCHES: ("sink", "query_id")}

# What a writer of outbox rows supplies; id, txid and created_at come from their defaults.
# The session setting that turns the outbox's NOTIFY on insert off (migration 0009): PostgreSQL
# refuses to PREPARE a transaction that sent one, so a two-phase transaction sets it to off.
NOTIFY_SETTING = "outbox.notify"

# The header the relay stamps every record with: the event's id, which consumers drop repeats by.
EVENT_ID_HEADER = "event_id"

OUTBOX_COLUMNS = ("event_id", "topic", "key", "value", "header_keys", "header_values")


def missing_tables(
    schema: str, names: Sequence[str], where: DatabaseUrl | None = None, *, note: str = ""
) -> OutboxError:
    """The one error for tables that are not there (a ConfigError), with the command that creates them."""
    one = len(names) == 1
    return error(
        "TABLES_MISSING",
        noun="table" if one else "tables",
        listed=", ".join(f"{schema}.{name}" for name in names),
        verb="is" if one else "are",
        where=f" in {where.safe}" if where is not None else "",
        schema=schema,
        note=f" ({note})" if note else "",
    )


def require(conn: psycopg.Connection[Any], url: DatabaseUrl, schema: str, names: Sequence[str]) -> None:
    """Raise `missing_tables` for those of `names` that do not exist in `schema`."""
    found = conn.execute(
        "SELECT to_regclass(name) FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n) ORDER BY n",
        [[sql.Identifier(schema, name).as_string(conn) for name in names]],
    ).fetchall()
    missing = [name for name, (regclass,) in zip(names, found, strict=True) if regclass is None]
    if missing:
        raise missing_tables(schema, missing, url)
    wanted = [(t, c) for t in names for c in ADDED_COLUMNS.get(t, ())]
    keyed = [t for t in names if t in CHANGED_KEYS]
    if not wanted and not keyed:
        return
    present = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = %s"
        " AND (table_name, column_name) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        [schema, [t for t, _ in wanted], [c for _, c in wanted]],
    ).fetchall()
    behind = [f"{schema}.{t}.{c}" for t, c in wanted if (t, c) not in set(present)]
    keys = dict(
        conn.execute(
            "SELECT c.relname::text, array_agg(a.attname::text ORDER BY k.n) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace s ON s.oid = c.relnamespace"
            " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            " WHERE i.indisprimary AND s.nspname = %s AND c.relname = ANY(%s) GROUP BY c.relname",
            [schema, keyed],
        ).fetchall()
    )
    behind += [
        f"{schema}.{t}'s primary key ({', '.join(CHANGED_KEYS[t])})"
        for t in keyed
        if tuple(keys.get(t, ())) != CHANGED_KEYS[t]
    ]
    if behind:
        raise error(
            "TABLES_OUTDATED",
            columns=", ".join(behind),
            verb="is" if len(behind) == 1 else "are",
            url=url.safe,
            schema=schema,
        )
