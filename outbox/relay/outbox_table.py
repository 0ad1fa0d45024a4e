"""The Postgres edge of the relay: one session that holds the shard's lock, reads deltas, cleans up.

The same connection holds the advisory lock, LISTENs, and runs the reads, so
when it breaks (server restart, network) the lock is gone too and the relay
starts over as a standby: it cannot go on reading without being the one
active instance.

A partition breaks nothing by itself: the socket stays open and the server
keeps the session, and with it the lock. So every round trip must answer
within `timeout` or the relay drops the connection (`answered_within`), and
the server ends a session silent for longer than a healthy relay ever is
(`server_limits`), which lets a standby take the lock.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import psycopg
from psycopg import sql

from outbox import debezium
from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError, ServiceUnavailable
from outbox.core.postgres import (
    answered_within,
    connect,
    keepalive,
    limit_session,
    pooled,
    scalar,
    server_limits,
)
from outbox.core.sqltext import bindable
from outbox.errors import error
from outbox.relay.position import Position, Shard, Target
from outbox.relay.resume import Mark
from outbox.relay.row import Row

# Set by migration 0002's trigger at each committing insert.
CHANNEL = "outbox_events"
USED = (tables.OUTBOX_EVENTS, tables.RELAY_DEAD_LETTERS, tables.OUTBOX_IDENTITY, tables.RELAY_POSITIONS)
SYNCHRONOUS_COMMIT = ("local", "on", "remote_write", "remote_apply")

# What a batch's byte budget counts of a row: its key and value.
SIZE = sql.SQL("(coalesce(octet_length(e.key), 0) + coalesce(octet_length(e.value), 0))")


# md5 is stable across server versions (hashtext is not promised to be): a row's
# shard is the first 32 bits of md5(key, or the event id when there is no key) mod N.
KEY_HASH = "('x00000000' || left(md5(coalesce(e.key, uuid_send(e.event_id))), 8))::bit(64)::bigint"


def _shard_filter(shard: Shard) -> sql.Composable:
    if shard.count == 1:
        return sql.SQL("")
    return sql.SQL(" AND mod({hash}, {count}) = {index}").format(
        hash=sql.SQL(KEY_HASH), count=sql.Literal(shard.count), index=sql.Literal(shard.index)
    )


P = ParamSpec("P")
T = TypeVar("T")


def round_trip(
    what: str,
) -> Callable[[Callable[Concatenate[OutboxTable, P], T]], Callable[Concatenate[OutboxTable, P], T]]:
    """A method whose queries must be answered within the table's timeout (`answered_within`)."""

    def guard(method: Callable[Concatenate[OutboxTable, P], T]) -> Callable[Concatenate[OutboxTable, P], T]:
        @functools.wraps(method)
        def guarded(table: OutboxTable, *args: P.args, **kwargs: P.kwargs) -> T:
            with answered_within(table.conn, table.timeout, table.url, what):
                return method(table, *args, **kwargs)

        return cast("Callable[Concatenate[OutboxTable, P], T]", guarded)  # functools.wraps types it apart

    return guard


def lock_key(schema: str, relay: str, shard: Shard) -> str:
    """The advisory lock that makes one instance of a relay shard the active one."""
    return f"outbox-relay/{schema}/{relay}/{shard.index}-of-{shard.count}"


def cleanup_key(schema: str) -> str:
    """The advisory lock each cleanup holds shared, and a relay shard new to the database takes
    once, alone, to wait out the cleanups that began before they could know of it."""
    return f"outbox-cleanup/{schema}"


class OutboxTable:
    def __init__(
        self,
        url: DatabaseUrl,
        schema: str,
        relay: str,
        shard: Shard,
        synchronous_commit: str = "on",
        timeout: float = 30.0,
        silence: float = 150.0,
    ) -> None:
        """timeout: seconds a round trip may take; silence: seconds after which the server ends
        a session it has heard nothing from (longer than a healthy relay is ever silent)."""
        if synchronous_commit not in SYNCHRONOUS_COMMIT:
            raise error("RELAY_SYNCHRONOUS_COMMIT_INVALID", choices=", ".join(SYNCHRONOUS_COMMIT))
        self.url, self.schema, self.relay, self.shard = url, schema, relay, shard
        self.synchronous_commit, self.timeout, self.silence = synchronous_commit, timeout, silence
        self._conn: psycopg.Connection[Any] | None = None
        self._listen = False
        self._notified = False  # a notification was taken in, not yet waited for
        names = {
            "events": sql.Identifier(schema, tables.OUTBOX_EVENTS),
            "dead": sql.Identifier(schema, tables.RELAY_DEAD_LETTERS),
            "positions": sql.Identifier(schema, tables.RELAY_POSITIONS),
            "shard": _shard_filter(shard),
            "hash": sql.SQL(KEY_HASH),
        }
        # Two ways into a delta. Starting one: through the txid index, since the
        # delta is the transactions at or past the base's xmax plus those it saw
        # running. Continuing one (a backlog published in parts): along the primary
        # key from the last id published, stopping after `limit` rows, so each
        # part costs its own size and not the size of what is left.
        # Decoding dominates a read, so columns come ready to send: empty header
        # arrays as NULL (nothing to decode) and date_part's float8, not extract's numeric.
        # A read's first statement. A table rewrite (ALTER TABLE with a volatile default or a new
        # type; pg_repack's copy) gives every row its own transaction id, so a snapshot taken while
        # one waits to commit sees the table empty (PostgreSQL's caveat for rewrites): the delta
        # looked empty and was gone past. The lock comes before the snapshot, which REPEATABLE
        # READ takes at the first query, so the snapshot sees any rewrite that held the table.
        self._begin = {
            fresh: sql.SQL(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, {mode};"
                " LOCK TABLE {events}, {dead} IN ACCESS SHARE MODE"
            ).format(mode=sql.SQL("READ WRITE" if fresh else "READ ONLY"), **names)
            for fresh in (True, False)
        }
        row = sql.SQL(
            "SELECT e.id, convert_to(e.event_id::text, 'UTF8') AS event_id, e.topic, e.key, e.value,"
            " nullif(e.header_keys, '{{}}') AS header_keys, nullif(e.header_values, '{{}}') AS header_values,"
            " date_part('epoch', e.created_at) AS created_at, {size} AS size FROM {events} e"
        ).format(size=SIZE, **names)
        wanted = sql.SQL(
            " AND pg_visible_in_snapshot(e.txid, %(target)s::pg_snapshot)"
            " AND e.id > %(after)s{shard}"
            " AND NOT EXISTS (SELECT FROM {dead} d WHERE d.relay = %(relay)s AND d.outbox_id = e.id"
            " AND d.event_id = e.event_id)"
            " ORDER BY e.id LIMIT %(limit)s"
        ).format(**names)
        # Up to `limit` rows, ending with the first that brings their keys and values to `budget`
        # bytes: a batch holds at most the budget and one row. Sizes come from the rows' headers,
        # values untouched, so a large row after the cut is never read. (After an outage, 5,000
        # rows can be gigabytes.)
        # The last column, the bytes up to each row, tells the reader whether the budget cut the read.
        # Summed over the `limit` rows, not under them: the LIMIT stays a bounded top-N read.
        budgeted = sql.SQL(
            "SELECT id, event_id, topic, key, value, header_keys, header_values, created_at, upto FROM"
            " (SELECT r.*, sum(r.size) OVER (ORDER BY r.id ROWS UNBOUNDED PRECEDING) AS upto"
            " FROM ({rows}) r) w WHERE w.upto - w.size < %(budget)s ORDER BY w.id"
        )
        self._start_delta = bindable(
            budgeted.format(
                rows=sql.SQL(
                    "{row} WHERE (e.txid >= pg_snapshot_xmax(%(base)s::pg_snapshot)"
                    " OR e.txid = ANY(ARRAY(SELECT pg_snapshot_xip(%(base)s::pg_snapshot)))){wanted}"
                ).format(row=row, wanted=wanted)
            )
        )
        self._continue_delta = bindable(
            budgeted.format(
                rows=sql.SQL(
                    "{row} WHERE NOT pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){wanted}"
                ).format(row=row, wanted=wanted)
            )
        )
        # Published by this relay, and by every other relay of the outbox too, as far as
        # the base of its last mark says: a slower relay's rows are never deleted under it.
        self._cleanup = bindable(
            sql.SQL(
                "DELETE FROM {events} WHERE id IN (SELECT e.id FROM {events} e"
                " WHERE e.txid < pg_snapshot_xmax(%(base)s::pg_snapshot)"
                " AND pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){shard}"
                " AND e.created_at < now() - make_interval(secs => %(retention)s)"
                " AND NOT EXISTS (SELECT FROM {positions} o WHERE o.relay <> %(relay)s"
                "  AND NOT EXISTS (SELECT FROM {positions} m WHERE m.relay = o.relay AND m.shards = o.shards"
                "   AND mod({hash}, m.shards) = m.shard"
                "   AND pg_visible_in_snapshot(e.txid, m.base::pg_snapshot)))"
                " ORDER BY e.id LIMIT %(limit)s)"
            ).format(**names)
        )
        # Written in the transaction that takes a delta's snapshot, committed synchronously
        # before any of the delta goes to Kafka: see resume.py.
        self._mark = bindable(
            sql.SQL(
                "INSERT INTO {positions} AS p (relay, shard, shards, base, target, mark, system_identifier)"
                " VALUES (%(relay)s, %(index)s, %(count)s, %(base)s, %(target)s, %(floor)s + 1, %(system)s)"
                " ON CONFLICT (relay, shard, shards) DO UPDATE SET base = excluded.base,"
                " target = excluded.target, mark = greatest(p.mark, %(floor)s) + 1,"
                " system_identifier = excluded.system_identifier, updated_at = now()"
                " RETURNING mark"
            ).format(**names)
        )
        # A relay's base moves on without a mark while deltas are empty; other relays'
        # cleanup needs to see it move (and a rewind may start from it: it is published).
        self._record_base = bindable(
            sql.SQL(
                "UPDATE {positions} SET base = %(base)s, updated_at = now()"
                " WHERE relay = %(relay)s AND shard = %(index)s AND shards = %(count)s"
                " AND pg_snapshot_xmax(base::pg_snapshot) < pg_snapshot_xmax(%(base)s::pg_snapshot)"
            ).format(**names)
        )
        self._read_layouts = bindable(
            sql.SQL(
                "SELECT DISTINCT shards FROM {positions} WHERE relay = %s AND shards <> %s ORDER BY 1"
            ).format(**names)
        )
        self._read_mark = bindable(
            sql.SQL(
                "SELECT base, target, mark, system_identifier FROM {positions}"
                " WHERE relay = %s AND shard = %s AND shards = %s"
            ).format(**names)
        )
        self.system = ""
        self._dead_letter = bindable(
            sql.SQL(
                "INSERT INTO {dead} (relay, outbox_id, event_id, topic, key, value, header_keys,"
                " header_values, created_at, error)"
                " SELECT %(relay)s, id, event_id, topic, key, value, header_keys, header_values, created_at,"
                " %(error)s FROM {events} WHERE id = %(id)s ON CONFLICT DO NOTHING"
            ).format(**names)
        )

    # -- session -------------------------------------------------------------

    def connect(self, *, listen: bool = True) -> None:
        """listen: for the channel writers notify on commit (the publishing session's, not the
        cleaner's), once the session holds the lock (`try_lock`)."""
        self._listen = listen
        self._conn = connect(
            self.url,
            autocommit=True,
            application_name=f"outbox-relay {self.relay}",
            timeout=self.timeout,
            settings=keepalive(self.timeout),
        )
        try:
            self._start_session()
        except (ConfigError, ServiceUnavailable):
            self.close()
            raise

    @round_trip("the session's first queries")
    def _start_session(self) -> None:
        conn = self.conn
        limit_session(conn, server_limits(self.timeout, self.silence))
        tables.require(conn, self.url, self.schema, USED)
        row = conn.execute(
            "SELECT pg_is_in_recovery(), system_identifier::text FROM pg_control_system()"
        ).fetchone()
        assert row is not None
        if row[0]:
            raise error("RELAY_STANDBY", url=self.url.safe)
        if pooled(conn):
            raise error("RELAY_POOLED", url=self.url.safe)
        self.system = str(row[1])

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None:
            raise error("RELAY_NOT_CONNECTED")
        return self._conn

    @round_trip("reading the outbox's id")
    def outbox_id(self) -> str:
        """The id `outbox db upgrade` gave this outbox: what the relay's Kafka state is keyed by."""
        query = sql.SQL("SELECT id::text FROM {}").format(sql.Identifier(self.schema, tables.OUTBOX_IDENTITY))
        row = self.conn.execute(query).fetchone()
        if row is None:
            raise error(
                "RELAY_OUTBOX_ID_MISSING", schema=self.schema, table=tables.OUTBOX_IDENTITY, url=self.url.safe
            )
        return str(row[0])

    @round_trip("reading which tables feed the outbox")
    def adopted(self) -> list[str]:
        """The tables `outbox db adopt-debezium` made feed this outbox (schema.table)."""
        return [f"{s}.{t}" for s, t in self.conn.execute(debezium.adopters(self.schema)).fetchall()]

    @round_trip("trying the lock")
    def try_lock(self) -> bool:
        """Become the one active instance of this relay shard, if no other session is. Only then
        does the session listen: psycopg keeps every notification a query meets, without bound,
        until it is waited for, and a standby never waits."""
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
            [lock_key(self.schema, self.relay, self.shard)],
        ).fetchone()
        locked = bool(row and row[0])
        if locked and self._listen:
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        return locked

    @round_trip("reading the mark")
    def mark(self) -> tuple[Mark | None, int]:
        """This shard's mark (None: it has none), and the database's next transaction id now."""
        row = self.conn.execute(self._read_mark, [self.relay, self.shard.index, self.shard.count]).fetchone()
        horizon = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        assert horizon is not None
        return (Mark(row[0], row[1], int(row[2]), row[3]) if row else None), int(horizon[0])

    @round_trip("reading the relay's shard counts")
    def layouts(self) -> list[int]:
        """The other shard counts this relay name has rows of in `relay_positions`."""
        rows = self.conn.execute(self._read_layouts, [self.relay, self.shard.count]).fetchall()
        return [count for (count,) in rows]

    @round_trip("recording the relay")
    def register(self, position: Position) -> None:
        """Record this shard, which the database has no row of, before its first snapshot.

        Other relays' cleanup deletes only rows every recorded relay has published. A
        shard recorded with its first delta's mark was unknown to them while it read
        that delta, and a cleanup then deleted rows of it the shard had yet to read.
        Recorded first, and once the cleanups that began before were over (their lock,
        `cleanup_key`), it is known to every cleanup that can meet its first snapshot.
        """
        conn = self.conn
        with conn.transaction():
            self._write_mark(position, position.base)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [cleanup_key(self.schema)])

    # -- reads ---------------------------------------------------------------

    @round_trip("reading a batch")
    def fetch(self, position: Position, limit: int, budget: int) -> tuple[Target, list[Row], bool]:
        """Up to `limit` rows of the delta after `position`, by id, as many as `budget` bytes of keys
        and values hold (at least one); the delta's target; and whether the budget cut the read.

        Without a target yet, the target is this transaction's own snapshot:
        exactly the transactions whose rows this read can see. When that delta
        has rows, the same transaction writes its mark and commits synchronously,
        so the WAL is flushed past every transaction the snapshot saw end.
        """
        conn = self.conn
        fresh = position.target is None
        self._take_notifications()
        if fresh:  # the snapshot taken below sees every commit they told of
            self._notified = False
        with conn.transaction():
            conn.execute(self._begin[fresh])
            if fresh:
                snapshot = str(scalar(conn.execute("SELECT pg_current_snapshot()")))
            else:
                snapshot = str(position.target)
            cursor = conn.cursor(binary=True)
            cursor.execute(
                self._continue_delta if position.after_id else self._start_delta,
                {
                    "base": position.base,
                    "target": snapshot,
                    "after": position.after_id,
                    "relay": self.relay,
                    "limit": limit,
                    "budget": budget,
                },
            )
            found = cursor.fetchall()
            # Short of `limit`, with the budget spent: a row after the last one may have been left out.
            cut = 0 < len(found) < limit and found[-1][-1] >= budget
            rows = [Row._make(r[:-1]) for r in found]
            mark = position.mark
            if fresh and rows:
                mark = self._write_mark(position, snapshot)
        return Target(snapshot, mark), rows, cut

    def _write_mark(self, position: Position, target: str) -> int:
        """This shard's mark for publishing `target` from `position`, committed (by the caller's
        transaction) as durably as `synchronous_commit` says; returns its number."""
        self.conn.execute("SELECT set_config('synchronous_commit', %s, true)", [self.synchronous_commit])
        written = self.conn.execute(
            self._mark,
            {
                "relay": self.relay,
                "index": self.shard.index,
                "count": self.shard.count,
                "base": position.base,
                "target": target,
                "floor": position.mark or 0,
                "system": self.system,
            },
        ).fetchone()
        assert written is not None
        return int(written[0])

    def wait(self, timeout: float, stop: threading.Event) -> None:
        """Until a NOTIFY (a commit that inserted events), the timeout, or `stop` is set.

        psycopg keeps notifications that arrive during a fetch for the next
        call, so a commit racing with a read is never slept through.
        """
        deadline = time.monotonic() + timeout
        if self._notified:
            self._notified = False
            return
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if list(self.conn.notifies(timeout=min(left, 0.2), stop_after=1)):
                return

    def _take_notifications(self) -> None:
        """Take in the notifications received, kept as one flag: psycopg keeps each, without bound,
        until waited for, and a relay halted on a poison row or publishing a backlog does not wait
        for hours (at 100 commits a second, about 2 GB a day)."""
        for _ in self.conn.notifies(timeout=0):
            self._notified = True

    # -- writes --------------------------------------------------------------

    @round_trip("recording the base")
    def record_base(self, base: str) -> None:
        """Tell the other relays of this outbox (their cleanup) that everything in `base` is published.

        Committed synchronously, as a mark is, so that a rewind never starts from it
        in a database that may have lost what it saw.
        """
        conn = self.conn
        with conn.transaction():
            conn.execute("SELECT set_config('synchronous_commit', %s, true)", [self.synchronous_commit])
            conn.execute(
                self._record_base,
                {"base": base, "relay": self.relay, "index": self.shard.index, "count": self.shard.count},
            )

    @round_trip("deleting published rows")
    def cleanup(self, base: str, limit: int, retention: float) -> int:
        """Delete up to `limit` published rows (visible in `base`) older than `retention` seconds.
        Under `cleanup_key`, taken before the DELETE's snapshot: a relay shard recorded after it
        waits for this one to end (`register`)."""
        with self.conn.transaction():
            self.conn.execute(
                "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 0))", [cleanup_key(self.schema)]
            )
            cur = self.conn.execute(
                self._cleanup, {"base": base, "limit": limit, "retention": retention, "relay": self.relay}
            )
        return cur.rowcount

    @round_trip("dead-lettering a row")
    def dead_letter(self, row_id: int, error: str) -> None:
        self.conn.execute(self._dead_letter, {"relay": self.relay, "id": row_id, "error": error})


@contextlib.contextmanager
def opened(table: OutboxTable, *, listen: bool = True) -> Iterator[OutboxTable]:
    table.connect(listen=listen)
    try:
        yield table
    finally:
        table.close()
