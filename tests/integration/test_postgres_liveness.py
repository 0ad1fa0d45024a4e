"""A PostgreSQL round trip that is not answered in time ends, with one line and no secret; a
watched one is left to run as long as the server works for it."""

from __future__ import annotations

import time

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ServiceUnavailable
from outbox.core.postgres import answered_within, connect, keepalive, limit_session, server_limits, watched


def test_a_round_trip_not_answered_in_time_drops_the_connection_with_one_line(database: DatabaseUrl) -> None:
    conn = connect(database, autocommit=True, settings=keepalive(3))
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught, answered_within(conn, 1, database, "sleeping"):
        conn.execute("SELECT pg_sleep(30)")
    assert time.monotonic() - started < 10
    assert caught.value.code == "POSTGRES_NO_ANSWER"
    assert (
        caught.value.message
        == f"PostgreSQL at {database.safe} did not answer sleeping within 1s; the connection was dropped"
    )
    assert conn.closed or conn.broken
    with psycopg.connect(database.libpq) as check:  # the server itself is untouched
        check.execute("SELECT 1")


def test_a_round_trip_answered_in_time_is_untouched(database: DatabaseUrl) -> None:
    with connect(database, autocommit=True) as conn:
        for _ in range(3):
            with answered_within(conn, 5, database, "a quick query"):
                assert conn.execute("SELECT 1").fetchone() == (1,)
        time.sleep(0.2)
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_the_server_takes_every_limit_the_relay_sets(database: DatabaseUrl) -> None:
    limits = server_limits(3, 18.2)
    with connect(database, autocommit=True, settings=keepalive(3)) as conn:
        limit_session(conn, limits)
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in limits}  # type: ignore[index]
        assert shown["idle_session_timeout"] == "19s" and shown["statement_timeout"] == "3s"
        assert conn.info.get_parameters().get("keepalives_idle") == "1"


def test_the_sinks_tasks_leave_statements_unbounded(database: DatabaseUrl) -> None:
    limits = server_limits(3, 6, bound_statements=False)
    with connect(database, autocommit=True) as conn:
        limit_session(conn, limits)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("6s",)


def test_a_watched_statement_runs_as_long_as_the_server_works_on_it(database: DatabaseUrl) -> None:
    with connect(database, autocommit=True) as conn, watched(conn, database, 0.5):
        started = time.monotonic()
        assert conn.execute("SELECT pg_sleep(3), 1").fetchone() == ("", 1)
        assert time.monotonic() - started >= 3  # six checks saw it active, and let it be


def test_a_watched_wait_on_a_session_the_server_left_idle_is_dropped(database: DatabaseUrl) -> None:
    """The client waits on its socket while the server's session has nothing to send (as when its
    answer was lost on the way): the second connection sees it idle, and the wait ends in one line."""
    conn = connect(database, autocommit=True)
    conn.execute("LISTEN nothing_is_ever_sent_here")
    pid, started = conn.info.backend_pid, time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught, watched(conn, database, 1):
        for _ in conn.notifies(timeout=30):
            pass
    assert time.monotonic() - started < 10
    assert caught.value.code == "POSTGRES_SESSION_LOST"
    assert caught.value.message.startswith(f"PostgreSQL at {database.safe} has session {pid} idle for ")
    assert caught.value.message.endswith("s while we wait on it; the connection was dropped")
    assert conn.closed or conn.broken
