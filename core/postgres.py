"""Connecting to PostgreSQL, and a driver failure as one line without the password.

Every command and the sink's driver connect through `connect`, so an
unreachable server reads the same everywhere and no error message carries
a secret from the URL.

A long-lived session (the relay's) also needs to notice a partition: a
query sent into a network that drops every byte waits for ever, since libpq
has no read timeout. `answered_within` ends such a wait; `keepalive` has the
kernel notice a peer that is gone, on both sides.
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

from core.config import DatabaseUrl
from core.errors import ServiceUnavailable

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


def keepalive(timeout: float) -> dict[str, int]:
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


def server_limits(timeout: float, silence: float) -> dict[str, str]:
    """Session settings with which the server ends what a lost client left behind: a statement
    running longer than `timeout`, and a session (and the locks it holds) silent for `silence`,
    in a transaction or not; its keepalives notice a client host that is gone in about `timeout`."""
    idle, interval, count, user_timeout = probing(timeout)
    return {
        "statement_timeout": f"{user_timeout // 1000}s",
        "idle_in_transaction_session_timeout": f"{math.ceil(silence)}s",
        "idle_session_timeout": f"{math.ceil(silence)}s",
        "tcp_keepalives_idle": str(idle),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(count),
        "tcp_user_timeout": str(user_timeout),
    }


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
        # A duplicate of the socket, ours to close; shutting it down ends the connection's too.
        with contextlib.suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(timeout, drop)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.Error:
        if dropped.is_set():
            raise ServiceUnavailable(
                f"PostgreSQL at {url.safe} did not answer {what} within {timeout:g}s;"
                " the connection was dropped"
            ) from None
        raise
    finally:
        timer.cancel()


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
        raise ServiceUnavailable(
            f"cannot reach PostgreSQL at {url.safe}: {reason(exc, url)}."
            " Check DATABASE_URL, or start a local server with `outbox dev up`."
        ) from None
