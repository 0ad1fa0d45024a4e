"""The Postgres edge of the relay: one session that holds the shard's lock, reads deltas, cleans up.

The same connection holds the advisory lock, LISTENs, and runs the reads, so
when it breaks (server restart, network) the lock is gone too and the relay
starts over as a standby: it cannot go on reading without being the one
active instance.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from core import tables
from core.config import DatabaseUrl
from core.errors import ConfigError, ServiceUnavailable
from core.postgres import connect
from core.sqltext import bindable
from outbox.relay.position import Position, Shard
from outbox.relay.row import Row

# Set by migration 0002's trigger at each committing insert.
CHANNEL = "outbox_events"
USED = (tables.OUTBOX_EVENTS, tables.RELAY_DEAD_LETTERS, tables.OUTBOX_IDENTITY)


def _shard_filter(shard: Shard) -> sql.Composable:
    if shard.count == 1:
        return sql.SQL("")
    # md5 is stable across server versions (hashtext is not promised to be): shard =
    # first 32 bits of md5(key, or the event id when there is no key) mod N.
    return sql.SQL(
        " AND mod(('x00000000' || left(md5(coalesce(e.key, uuid_send(e.event_id))), 8))::bit(64)::bigint,"
        " {count}) = {index}"
    ).format(count=sql.Literal(shard.count), index=sql.Literal(shard.index))


class OutboxTable:
    def __init__(self, url: DatabaseUrl, schema: str, relay: str, shard: Shard) -> None:
        self.url, self.schema, self.relay, self.shard = url, schema, relay, shard
        self._conn: psycopg.Connection[Any] | None = None
        names = {
            "events": sql.Identifier(schema, tables.OUTBOX_EVENTS),
            "dead": sql.Identifier(schema, tables.RELAY_DEAD_LETTERS),
            "shard": _shard_filter(shard),
        }
        # Two ways into a delta. Starting one: through the txid index, since the
        # delta is the transactions at or past the base's xmax plus those it saw
        # running. Continuing one (a backlog published in parts): along the primary
        # key from the last id published, stopping after `limit` rows, so each
        # part costs its own size and not the size of what is left.
        # Decoding dominates a read, so columns come ready to send: empty header
        # arrays as NULL (nothing to decode) and date_part's float8, not extract's numeric.
        row = sql.SQL(
            "SELECT e.id, convert_to(e.event_id::text, 'UTF8'), e.topic, e.key, e.value,"
            " nullif(e.header_keys, '{{}}'), nullif(e.header_values, '{{}}'),"
            " date_part('epoch', e.created_at) FROM {events} e"
        ).format(**names)
        wanted = sql.SQL(
            " AND pg_visible_in_snapshot(e.txid, %(target)s::pg_snapshot)"
            " AND e.id > %(after)s{shard}"
            " AND NOT EXISTS (SELECT FROM {dead} d WHERE d.relay = %(relay)s AND d.outbox_id = e.id)"
            " ORDER BY e.id LIMIT %(limit)s"
        ).format(**names)
        self._start_delta = bindable(
            sql.SQL(
                "{row} WHERE (e.txid >= pg_snapshot_xmax(%(base)s::pg_snapshot)"
                " OR e.txid = ANY(ARRAY(SELECT pg_snapshot_xip(%(base)s::pg_snapshot)))){wanted}"
            ).format(row=row, wanted=wanted)
        )
        self._continue_delta = bindable(
            sql.SQL("{row} WHERE NOT pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){wanted}").format(
                row=row, wanted=wanted
            )
        )
        self._cleanup = bindable(
            sql.SQL(
                "DELETE FROM {events} WHERE id IN (SELECT e.id FROM {events} e"
                " WHERE e.txid < pg_snapshot_xmax(%(base)s::pg_snapshot)"
                " AND pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){shard}"
                " AND e.created_at < now() - make_interval(secs => %(retention)s)"
                " ORDER BY e.id LIMIT %(limit)s)"
            ).format(**names)
        )
        self._dead_letter = bindable(
            sql.SQL(
                "INSERT INTO {dead} (relay, outbox_id, event_id, topic, key, value, header_keys,"
                " header_values, created_at, error)"
                " SELECT %(relay)s, id, event_id, topic, key, value, header_keys, header_values, created_at,"
                " %(error)s FROM {events} WHERE id = %(id)s ON CONFLICT DO NOTHING"
            ).format(**names)
        )

    # -- session -------------------------------------------------------------

    def connect(self) -> None:
        self._conn = conn = connect(self.url, autocommit=True, application_name=f"outbox-relay {self.relay}")
        try:
            tables.require(conn, self.url, self.schema, USED)
        except ConfigError:
            self.close()
            raise
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise ServiceUnavailable("not connected to PostgreSQL")
        return self._conn

    def outbox_id(self) -> str:
        """The id `outbox db upgrade` gave this outbox: what the relay's Kafka state is keyed by."""
        query = sql.SQL("SELECT id::text FROM {}").format(sql.Identifier(self.schema, tables.OUTBOX_IDENTITY))
        row = self.conn.execute(query).fetchone()
        if row is None:
            raise ConfigError(
                f"{self.schema}.{tables.OUTBOX_IDENTITY} in {self.url.safe} is empty:"
                f" run `outbox db upgrade --schema {self.schema}` (it adds the outbox's id)"
            )
        return str(row[0])

    def try_lock(self) -> bool:
        """Become the one active instance of this relay shard, if no other session is."""
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
            [f"outbox-relay/{self.schema}/{self.relay}/{self.shard.index}-of-{self.shard.count}"],
        ).fetchone()
        return bool(row and row[0])

    # -- reads ---------------------------------------------------------------

    def fetch(self, position: Position, limit: int) -> tuple[str, list[Row]]:
        """Up to `limit` rows of the delta after `position`, by id, and the delta's target snapshot.

        Without a target yet, the target is this transaction's own snapshot:
        exactly the transactions whose rows this read can see.
        """
        conn = self.conn
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            target = position.target or str(conn.execute("SELECT pg_current_snapshot()").fetchone()[0])  # type: ignore[index]
            cursor = conn.cursor(binary=True)
            cursor.execute(
                self._continue_delta if position.after_id else self._start_delta,
                {
                    "base": position.base,
                    "target": target,
                    "after": position.after_id,
                    "relay": self.relay,
                    "limit": limit,
                },
            )
            rows = list(map(Row._make, cursor.fetchall()))
        return target, rows

    def wait(self, timeout: float, stop: threading.Event) -> None:
        """Until a NOTIFY (a commit that inserted events), the timeout, or `stop` is set.

        psycopg keeps notifications that arrive during a fetch for the next
        call, so a commit racing with a read is never slept through.
        """
        deadline = time.monotonic() + timeout
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if list(self.conn.notifies(timeout=min(left, 0.2), stop_after=1)):
                return

    # -- writes --------------------------------------------------------------

    def cleanup(self, base: str, limit: int, retention: float) -> int:
        """Delete up to `limit` published rows (visible in `base`) older than `retention` seconds."""
        cur = self.conn.execute(self._cleanup, {"base": base, "limit": limit, "retention": retention})
        return cur.rowcount

    def dead_letter(self, row_id: int, error: str) -> None:
        self.conn.execute(self._dead_letter, {"relay": self.relay, "id": row_id, "error": error})


@contextlib.contextmanager
def opened(table: OutboxTable) -> Iterator[OutboxTable]:
    table.connect()
    try:
        yield table
    finally:
        table.close()
