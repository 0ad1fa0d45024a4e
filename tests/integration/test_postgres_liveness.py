"""A PostgreSQL round trip that is not answered in time ends, with one line and no secret."""

from __future__ import annotations

import time

import psycopg
import pytest

from core.config import DatabaseUrl
from core.errors import ServiceUnavailable
from core.postgres import answered_within, connect, keepalive, server_limits


def test_a_round_trip_not_answered_in_time_drops_the_connection_with_one_line(database: DatabaseUrl) -> None:
    conn = connect(database, autocommit=True, settings=keepalive(3))
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as caught, answered_within(conn, 1, database, "sleeping"):
        conn.execute("SELECT pg_sleep(30)")
    assert time.monotonic() - started < 10
    assert (
        str(caught.value)
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
        conn.execute(
            "SELECT set_config(name, setting, false) FROM unnest(%s::text[], %s::text[]) AS s(name, setting)",
            [list(limits), list(limits.values())],
        )
        shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in limits}  # type: ignore[index]
        assert shown["idle_session_timeout"] == "19s" and shown["statement_timeout"] == "3s"
        assert conn.info.get_parameters().get("keepalives_idle") == "1"
