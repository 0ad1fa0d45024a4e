"""The relay and the sink behind a connection pooler (PgBouncer), as platform teams run PostgreSQL.

The relay's one active instance is the holder of a session's advisory lock.
Behind a pooler in transaction mode each statement borrows a server session,
and every instance whose lock request met the session holding the lock was
granted it too: two relays published at once (each event twice, at least
once; a fencing loop, exactly once). A pooler also tells the client a process
id of its own, which the sink's tasks used to find their session on the server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from outbox.core.postgres import watched
from outbox_dev import pgbouncer
from outbox_dev.process import stop
from sinks.postgres import PostgresSink
from tests.cli import outbox
from tests.helpers import unique
from tests.relay_support import relay_job
from tests.sink_support import apply_batches, event, ledger, table

# Every test here starts PgBouncer; without it none can run (it is optional: .ci/run installs it).
if pgbouncer.binary() is None:
    pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)", allow_module_level=True)


@pytest.fixture(scope="module")
def bouncer(tmp_path_factory: pytest.TempPathFactory, server_url: DatabaseUrl) -> Iterator[dict[str, int]]:
    """PgBouncer in front of the tests' server, in each mode: its port by mode."""
    port = urlsplit(server_url.raw).port
    assert port is not None
    # One server session in transaction mode: every lock request meets the one holding the lock.
    sizes = {"session": 4, "transaction": 1}
    started = {
        mode: pgbouncer.start(tmp_path_factory.mktemp(f"pgbouncer-{mode}"), port, mode, pool_size=sizes[mode])
        for mode in pgbouncer.MODES
    }
    yield {mode: service.port for mode, service in started.items()}
    for service in started.values():
        stop(service.pid)


def through(url: DatabaseUrl, port: int) -> DatabaseUrl:
    """The same database, reached through the pooler on `port`."""
    parts = urlsplit(url.raw)
    login, _, _ = parts.netloc.rpartition("@")
    return DatabaseUrl.parse(urlunsplit(parts._replace(netloc=f"{login}@{parts.hostname}:{port}")))


@pytest.mark.parametrize("mode", pgbouncer.MODES)
def test_a_relay_behind_a_pooler_is_refused_in_one_line(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bouncer: dict[str, int], mode: str
) -> None:
    pooled = through(outbox_db, bouncer[mode])
    name = unique("relay")
    jobs = [
        relay_job(tmp_path, {**env, "DATABASE_URL": pooled.raw}, name, "--delivery", "at-least-once")[0]
        for _ in range(2)
    ]
    for job in jobs:
        assert job.wait(30) == 2, job.output()
        assert "[RELAY_POOLED]" in job.output() and "Traceback" not in job.output(), job.output()


def test_a_watched_statement_behind_a_pooler_runs_as_long_as_it_must(
    outbox_db: DatabaseUrl, bouncer: dict[str, int]
) -> None:
    """watched() asked the server about the session by the process id the connection was told at
    its start; a pooler tells one of its own, so no session matched, and every sink task whose
    transaction ran past the database timeout was dropped (POSTGRES_SESSION_LOST)."""
    pooled = through(outbox_db, bouncer["session"])
    with psycopg.connect(pooled.libpq, autocommit=True) as conn, watched(conn, pooled, 1):
        conn.execute("SELECT pg_sleep(3)")


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_the_sink_applies_through_a_pooler_in_session_mode(  # type: ignore[no-untyped-def]
    spark, db: DatabaseUrl, pg: psycopg.Connection, bouncer: dict[str, int], tasks: bool
) -> None:
    pooled = through(db, bouncer["session"])
    events = [event(str(uuid.uuid4()), n) for n in range(20)]
    writer = apply_batches(
        spark, PostgresSink("orders", url=pooled.raw), [events[:10], events[10:]], tasks=tasks
    )
    assert writer.last is not None and writer.last.fresh == 10
    assert len(table(pg)) == 20 and ledger(pg) == {0: 20}


def test_a_pooler_that_refuses_libpqs_options_is_named(
    tmp_path: Path, outbox_db: DatabaseUrl, server_url: DatabaseUrl, bootstrap: str
) -> None:
    """PgBouncer refuses the `options` startup parameter unless told to ignore it, and our URLs
    carry one (TimeZone=UTC). The relay said "cannot reach PostgreSQL ... start a local server with
    `outbox dev up`" and retried for ever; every other command said the same."""
    port = urlsplit(server_url.raw).port
    assert port is not None
    strict = pgbouncer.start(tmp_path / "pgbouncer", port, "session", ignore_options=False)
    try:
        env = {"DATABASE_URL": through(outbox_db, strict.port).raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        result = outbox("check", "--no-java", env=env)
    finally:
        stop(strict.pid)
    assert result.code != 0
    assert "ignore_startup_parameters" in result.out + result.err, result


def test_outbox_check_names_a_pooler(outbox_db: DatabaseUrl, bouncer: dict[str, int], bootstrap: str) -> None:
    kafka = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}  # one that answers, rather than a 10 s timeout
    direct = outbox("check", "--no-java", env={"DATABASE_URL": outbox_db.raw, **kafka})
    assert "ok   pooler: none" in direct.out, direct
    pooled = outbox(
        "check", "--no-java", env={"DATABASE_URL": through(outbox_db, bouncer["session"]).raw, **kafka}
    )
    assert "WARN pooler: PostgreSQL is reached through a connection pooler" in pooled.out, pooled


def test_relay_commands_through_a_pooler_read_but_do_not_change(
    outbox_db: DatabaseUrl, bouncer: dict[str, int]
) -> None:
    """rebase and forget decide from a relay's lock whether it runs: refused through a pooler.
    Listing relays, and `outbox status`, still answer (a first cut refused them too)."""
    with psycopg.connect(outbox_db.libpq, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO relay_positions (relay, shard, shards, base, target, mark, system_identifier)"
            " VALUES ('r', 0, 1, '1:1:', '1:1:', 1, '0')"
        )
    env = {"DATABASE_URL": through(outbox_db, bouncer["session"]).raw}
    listed = outbox("relays", "list", env=env)
    assert listed.code == 0 and "r" in listed.out, listed
    assert outbox("status", env={**env, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}).code in (0, 1)
    for args in (("relays", "rebase"), ("relays", "forget", "r")):
        refused = outbox(*args, env=env)
        assert refused.code == 2 and "[RELAY_POOLED]" in refused.err, refused


def test_a_watched_statement_is_not_dropped_when_the_pool_is_full(
    tmp_path: Path, outbox_db: DatabaseUrl, server_url: DatabaseUrl
) -> None:
    """The watch asks about the session on a second connection, which a full pool queues: that
    unanswered check is the pool's, not a partition, and dropped a task that was working fine."""
    port = urlsplit(server_url.raw).port
    assert port is not None
    full = pgbouncer.start(tmp_path / "pgbouncer", port, "session", pool_size=1)
    try:
        pooled = through(outbox_db, full.port)
        with psycopg.connect(pooled.libpq, autocommit=True) as conn, watched(conn, pooled, 1):
            conn.execute("SELECT pg_sleep(3)")
    finally:
        stop(full.pid)
