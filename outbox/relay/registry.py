"""The relays of an outbox as PostgreSQL knows them (`relay_positions`): listed, rebased, forgotten.

Operator commands, run with the relays concerned stopped (each takes their locks
to be sure). `rebase` is the way on when a relay refuses a database of another
cluster (resume.py): every row left in the outbox is stamped with the rebase's
own transaction id, so every relay of the outbox publishes them again, once,
in id order, and consumers drop what they had by event id.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from outbox.core import tables
from outbox.core.postgres import pooled, scalar
from outbox.errors import error
from outbox.relay.outbox_table import lock_key
from outbox.relay.position import Shard
from outbox.relay.resume import REBASED


@dataclass(frozen=True)
class Registered:
    relay: str
    shard: Shard
    base: str
    mark: int
    system: str
    updated_at: datetime
    running: bool


def registered(conn: psycopg.Connection[Any], schema: str) -> list[Registered]:
    rows = conn.execute(
        sql.SQL(
            "SELECT relay, shard, shards, base, mark, system_identifier, updated_at FROM {}"
            " ORDER BY relay, shards, shard"
        ).format(sql.Identifier(schema, tables.RELAY_POSITIONS))
    ).fetchall()
    found = []
    for relay, index, count, base, mark, system, updated in rows:
        shard = Shard(index, count)
        with _locked(conn, schema, [(relay, shard)]) as free:
            found.append(Registered(relay, shard, base, mark, system, updated, running=not free))
    return found


def rebase(
    conn: psycopg.Connection[Any], schema: str, add: Sequence[tuple[str, Shard]] = ()
) -> tuple[int, int]:
    """Stamp every outbox row anew and start every relay (and those in `add`) from before them.

    Returns (rows stamped, relay shards rebased).
    """
    names = {
        "events": sql.Identifier(schema, tables.OUTBOX_EVENTS),
        "positions": sql.Identifier(schema, tables.RELAY_POSITIONS),
    }
    _direct(conn)
    shards = [(r.relay, r.shard) for r in registered(conn, schema)] + list(add)
    with _locked(conn, schema, shards) as free:
        if not free:
            raise error("RELAY_REBASE_WHILE_RUNNING", schema=schema)
        with conn.transaction():
            # Taken before this transaction has an id: the stamp below is not visible in it.
            snapshot = str(scalar(conn.execute("SELECT pg_current_snapshot()")))
            # The table refuses updates (its history is its order); this one rewrites no event,
            # only the id of the transaction it counts as written by. Nobody sees the trigger off.
            conn.execute(
                sql.SQL("ALTER TABLE {events} DISABLE TRIGGER outbox_events_insert_only").format(**names)
            )
            # Not rows at or below id 0, which no relay reads (0012's check refuses them since;
            # left from before, they fail its check on update).
            stamped = conn.execute(
                sql.SQL("UPDATE {events} SET txid = pg_current_xact_id() WHERE id > 0").format(**names)
            ).rowcount
            conn.execute(
                sql.SQL("ALTER TABLE {events} ENABLE TRIGGER outbox_events_insert_only").format(**names)
            )
            for relay, shard in shards:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {positions}"
                        " (relay, shard, shards, base, target, mark, system_identifier)"
                        " SELECT %(relay)s, %(index)s, %(count)s, %(snapshot)s, %(snapshot)s, %(rebased)s,"
                        " system_identifier::text FROM pg_control_system()"
                        " ON CONFLICT (relay, shard, shards) DO UPDATE SET base = excluded.base,"
                        " target = excluded.target, mark = excluded.mark,"
                        " system_identifier = excluded.system_identifier, updated_at = now()"
                    ).format(**names),
                    {
                        "relay": relay,
                        "index": shard.index,
                        "count": shard.count,
                        "snapshot": snapshot,
                        "rebased": REBASED,
                    },
                )
    return stamped, len(set(shards))


def forget(conn: psycopg.Connection[Any], schema: str, relay: str) -> int:
    """Drop a retired relay's rows, so that cleanup no longer waits for it. Returns how many."""
    _direct(conn)
    shards = [(r.relay, r.shard) for r in registered(conn, schema) if r.relay == relay]
    if not shards:
        raise error("RELAY_NOT_RECORDED", relay=relay, schema=schema)
    with _locked(conn, schema, shards) as free:
        if not free:
            raise error("RELAY_FORGET_WHILE_RUNNING", relay=relay)
        table = sql.Identifier(schema, tables.RELAY_POSITIONS)
        return conn.execute(sql.SQL("DELETE FROM {} WHERE relay = %s").format(table), [relay]).rowcount


def _direct(conn: psycopg.Connection[Any]) -> None:
    """Refuse to change what relays stand on through a pooler: a borrowed session (transaction
    pooling) can show a running relay's lock as free. Reads (`registered`) only say it."""
    if pooled(conn):
        info = conn.info
        raise error("RELAY_POOLED", url=f"postgresql://{info.host}:{info.port}/{info.dbname}")


@contextlib.contextmanager
def _locked(
    conn: psycopg.Connection[Any], schema: str, shards: Sequence[tuple[str, Shard]]
) -> Iterator[bool]:
    """Hold the active-instance locks of these relay shards; yields False if one is taken."""
    taken: list[str] = []
    try:
        for key in dict.fromkeys(lock_key(schema, relay, shard) for relay, shard in shards):
            got = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [key]).fetchone()
            if not (got and got[0]):
                break
            taken.append(key)
        yield len(taken) == len(set(shards))
    finally:
        for key in taken:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
