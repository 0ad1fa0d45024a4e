"""Connecting to PostgreSQL, and a driver failure as one line without the password.

Every command and the sink's driver connect through `connect`, so an
unreachable server reads the same everywhere and no error message carries
a secret from the URL.

A long-lived session (the relay's) also needs to notice a partition: a
query sent into a network that drops every byte waits for ever, since libpq
has no read timeout. `answered_within` ends such a wait; `keepalive` has the
kernel notice a peer that is gone, on both sides. A transaction whose
statements may rightly run for minutes (a sink task's) is `watched` instead:
it is dropped when the server, asked over a second connection, cannot be
reached or is no longer working for it.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ServiceUnavailable, error

CONNECT_TIMEOUT = 10  # seconds


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, or its type's name when it has none."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def reason(exc: BaseException, url: DatabaseUrl) -> str:
    """The error's first line with every secret of `url` masked."""
    return url.scrub(first_line(exc))


def probing(timeout: float) -> tuple[int, int, int, int]:
    """TCP keepalive idle and interval seconds, probe count, and tcp_user_timeout (ms) under which a
    kernel gives up on a silent peer in about `timeout` seconds (3 at least): one rule for both ends."""
    seconds = max(3, math.ceil(timeout))
    return max(1, seconds // 2), max(1, seconds // 6), 3, seconds * 1000


def keepalive(timeout: float) -> dict[str, Any]:
    """libpq settings under which the client's kernel gives up on a silent server in about
    `timeout` seconds: keepalive probes on an idle link, and a bound on unacknowledged sends
    (tcp_user_timeout, Linux). Through a proxy that holds both legs open, only
    `answered_within` helps; across a real partition these end the socket as well."""
    idle, interval, count, user_timeout = probing(timeout)
    return {
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": user_timeout,
    }


def server_limits(timeout: float, silence: float, *, bound_statements: bool = True) -> dict[str, str]:
    """Session settings with which the server ends what a lost client left behind: a statement
    running longer than `timeout` (unless not `bound_statements`), and a session (and the locks
    it holds) silent for `silence`, in a transaction or not; its keepalives notice a client host
    that is gone in about `timeout`."""
    idle, interval, count, user_timeout = probing(timeout)
    statements = {"statement_timeout": f"{user_timeout // 1000}s"} if bound_statements else {}
    return {
        **statements,
        "idle_in_transaction_session_timeout": f"{math.ceil(silence)}s",
        "idle_session_timeout": f"{math.ceil(silence)}s",
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(count),
        "tcp_user_timeout": str(user_timeout),
    }


def scalar(cursor: psycopg.Cursor[Any]) -> Any:
    """The one value of a statement that always returns one row (a function call, an aggregate)."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("no row from a statement that always returns one")
    return row[0]


def server_pid(conn: psycopg.Connection[Any]) -> int:
    """The process id of the server session serving `conn` now. Not `conn.info.backend_pid`: that
    is what the connection was told at its start, and a pooler (PgBouncer) tells one of its own."""
    return int(scalar(conn.execute("SELECT pg_backend_pid()")))


def pooled(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` reaches PostgreSQL through a connection pooler: the process id it was told
    is not its session's. (Directly, and through a tunnel or TCP proxy, they are the same.)"""
    return conn.info.backend_pid != server_pid(conn)


def limit_session(conn: psycopg.Connection[Any], limits: dict[str, str]) -> None:
    """Set `server_limits` for the rest of the session."""
    conn.execute(
        "SELECT set_config(name, setting, false) FROM unnest(%s::text[], %s::text[]) AS s(name, setting)",
        [list(limits), list(limits.values())],
    )


def _shut(conn: psycopg.Connection[Any]) -> None:
    """End the connection's socket from another thread: a wait on it ends at once with an error."""
    # A duplicate of the socket, ours to close; shutting it down ends the connection's too.
    with contextlib.suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def answered_within(
    conn: psycopg.Connection[Any], timeout: float, url: DatabaseUrl, what: str
) -> Iterator[None]:
    """Raise ServiceUnavailable if what runs inside takes longer than `timeout` seconds.

    psycopg's sync API has no timeout per query, and a wait on a socket nothing
    answers never ends. When the time is up, another thread shuts the socket
    down: the wait ends at once with an error, as if the server had closed the
    connection, and the connection is done for.
    """
    dropped = threading.Event()

    def drop() -> None:
        dropped.set()
        _shut(conn)

    timer = threading.Timer(timeout, drop)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.Error:
        if dropped.is_set():
            raise error("POSTGRES_NO_ANSWER", url=url.safe, what=what, timeout=timeout) from None
        raise
    finally:
        timer.cancel()


def working_for(state: str | None, quiet: float, timeout: float) -> bool:
    """Whether a session its client waits on is worth waiting for, from the server's view of it
    (pg_stat_activity): it runs a statement (a lock wait included), or it went quiet less than
    `timeout` seconds ago. Quiet longer, inside a transaction, its answer was lost on the way."""
    return state == "active" or (state is not None and quiet < timeout)


_SESSION_STATE = (
    "SELECT state, extract(epoch FROM clock_timestamp() - state_change)::float8"
    " FROM pg_stat_activity WHERE pid = %s"
)


@contextlib.contextmanager
def watched(conn: psycopg.Connection[Any], url: DatabaseUrl, timeout: float) -> Iterator[None]:
    """Drop `conn` if, while what runs inside waits on it, the server stops working for it.

    Every `timeout` seconds a second connection asks the server about this
    connection's session (`working_for`). A server that cannot be reached, or
    whose session is gone or idle with our answer lost, gets the connection
    dropped: the wait ends with ServiceUnavailable saying which. Unlike a
    deadline, a statement that rightly runs for an hour is left to run. Behind a pooler a check
    that goes unanswered is the pool's (full, it queues the second connection), not a partition:
    there the connection is dropped only on the server's word, and keepalives catch a partition.
    """
    with answered_within(conn, timeout, url, "the session's pid"):  # idle for long, it may be silent
        pid = server_pid(conn)
    done, why = threading.Event(), []
    behind_pooler = pid != conn.info.backend_pid

    def state() -> tuple[str | None, float]:
        side = psycopg.connect(
            url.libpq, autocommit=True, connect_timeout=max(2, math.ceil(timeout)), **keepalive(timeout)
        )
        with side, answered_within(side, timeout, url, "a check of a session"):
            row = side.execute(_SESSION_STATE, [pid]).fetchone()
        return (row[0], row[1]) if row else (None, 0.0)

    def watch() -> None:
        while not done.wait(timeout):
            try:
                session, quiet = state()
            except ServiceUnavailable:
                if behind_pooler:
                    continue
                cause = f"did not answer a check of session {pid} within {timeout:g}s"
            except psycopg.Error as exc:
                if behind_pooler:
                    continue
                cause = f"cannot be asked about session {pid} ({reason(exc, url)})"
            else:
                if working_for(session, quiet, timeout):
                    continue
                cause = f"has session {pid} {session} for {quiet:.0f}s" if session else f"ended session {pid}"
                cause += " while we wait on it"
            if not done.is_set():
                why.append(cause)
                _shut(conn)
            return

    watcher = threading.Thread(target=watch, name=f"watch pid {pid}", daemon=True)
    watcher.start()
    try:
        yield
    except psycopg.Error:
        if why:
            raise error("POSTGRES_SESSION_LOST", url=url.safe, cause=why[0]) from None
        raise
    finally:
        done.set()


def connect(
    url: DatabaseUrl,
    *,
    autocommit: bool = False,
    application_name: str | None = None,
    timeout: float = CONNECT_TIMEOUT,
    settings: dict[str, Any] | None = None,
) -> psycopg.Connection[Any]:
    """A connection, or ServiceUnavailable saying where and why, with the usual remedy.

    settings: libpq settings (`keepalive`) where the URL does not give its own.
    """
    given = url.parameters
    extra = {k: v for k, v in (settings or {}).items() if k not in given}
    if application_name:
        extra["application_name"] = application_name
    try:
        return psycopg.connect(
            url.libpq, autocommit=autocommit, connect_timeout=max(1, int(timeout)), **extra
        )
    except psycopg.Error as exc:
        if "unsupported startup parameter" in str(exc):  # reached, and refused: no outage
            raise error("POSTGRES_POOLER_OPTIONS", url=url.safe, reason=reason(exc, url)) from None
        raise error("POSTGRES_UNREACHABLE", url=url.safe, reason=reason(exc, url)) from None
