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
from outbox.errors import error
from outbox.relay.position import Position, Shard, Target
from outbox.relay.resume import Mark
from outbox.relay.row import Row
from outbox.relay.statements import KEY_HASH as KEY_HASH  # importable here too, as before it moved
from outbox.relay.statements import Statements

USED = (tables.OUTBOX_EVENTS, tables.RELAY_DEAD_LETTERS, tables.OUTBOX_IDENTITY, tables.RELAY_POSITIONS)
SYNCHRONOUS_COMMIT = ("local", "on", "remote_write", "remote_apply")


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
        self._sql = Statements(schema, shard)
        self.system = ""

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
        row = self.conn.execute(self._sql.outbox_id).fetchone()
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
            self.conn.execute(self._sql.listen)
        return locked

    @round_trip("reading the mark")
    def mark(self) -> tuple[Mark | None, int]:
        """This shard's mark (None: it has none), and the database's next transaction id now."""
        row = self.conn.execute(
            self._sql.read_mark, [self.relay, self.shard.index, self.shard.count]
        ).fetchone()
        horizon = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        assert horizon is not None
        return (Mark(row[0], row[1], int(row[2]), row[3]) if row else None), int(horizon[0])

    @round_trip("reading the relay's shard counts")
    def layouts(self) -> list[int]:
        """The other shard counts this relay name has rows of in `relay_positions`."""
        rows = self.conn.execute(self._sql.read_layouts, [self.relay, self.shard.count]).fetchall()
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
            conn.execute(self._sql.begin[fresh])
            if fresh:
                snapshot = str(scalar(conn.execute("SELECT pg_current_snapshot()")))
            else:
                snapshot = str(position.target)
            cursor = conn.cursor(binary=True)
            cursor.execute(
                self._sql.continue_delta if position.after_id else self._sql.start_delta,
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
            self._sql.mark,
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
                self._sql.record_base,
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
                self._sql.cleanup, {"base": base, "limit": limit, "retention": retention, "relay": self.relay}
            )
        return cur.rowcount

    @round_trip("dead-lettering a row")
    def dead_letter(self, row_id: int, error: str) -> None:
        self.conn.execute(self._sql.dead_letter, {"relay": self.relay, "id": row_id, "error": error})


@contextlib.contextmanager
def opened(table: OutboxTable, *, listen: bool = True) -> Iterator[OutboxTable]:
    table.connect(listen=listen)
    try:
        yield table
    finally:
        table.close()
