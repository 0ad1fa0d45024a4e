"""The relay when PostgreSQL goes back in time: a crash, a failover to a replica, a restore.

Each of these can hand transaction ids out again. A relay whose position in
Kafka lies past them must neither skip the new transactions nor delete their
rows (issue: xid reuse under a position kept outside the database). Every test
checks each event: none missing, duplicates only of events the database itself
took back, and per-key order.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_events
from outbox_dev import postgres
from tests.cli import outbox
from tests.helpers import Job, OwnPostgres, create_topic, unique, wait_for
from tests.relay_support import Committed, Writers, assert_exactly_once, published, relay_job, terminate

PARTITIONS = 3


def write(url: DatabaseUrl, topic: str, transactions: int = 15) -> Committed:
    writers = Writers(url, topic).start(transactions=transactions, max_delay=0.005)
    writers.join()
    return writers.committed


def ids(*batches: Committed) -> set[str]:
    return {e for batch in batches for events in batch.by_key.values() for e in events}


def lose_the_tail(server: OwnPostgres, topic: str) -> int:
    """Leave WAL that only the (paused) WAL writer would flush: a transaction that took an
    xid and rolled back. A crash now loses its abort record, and its xid is handed out again."""
    server.pause_wal_writer()
    with psycopg.connect(server.url.libpq) as conn, conn.transaction(force_rollback=True):
        add_events(conn, [Event(topic, {"rolled": "back"}, key="rolled-back")])
        return int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])  # type: ignore[index]


def wait_for_events(bootstrap: str, topic: str, wanted: set[str], timeout: float = 90) -> list:
    records: list = []

    def arrived() -> bool:
        nonlocal records
        records = published(bootstrap, topic, PARTITIONS)
        return wanted <= {event for *_, event in records}

    wait_for(arrived, timeout, f"{len(wanted)} events published")
    return records


def start_relay(tmp: Path, url: str, bootstrap: str, name: str) -> Job:
    env = {"DATABASE_URL": url, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    job, _ = relay_job(tmp, env, name, "--batch-size", "20", label=unique("relay"))
    return job


def test_a_crash_that_loses_the_wals_tail_loses_no_event(
    tmp_path: Path, durable_postgres: OwnPostgres, bootstrap: str
) -> None:
    """The issue's reproduction: a rolled-back transaction's xid, the relay's base past it, a crash
    with -m immediate, the xid handed out again. The relay recovers by itself, exactly once."""
    pg, topic, name = durable_postgres, create_topic(bootstrap, unique("events"), PARTITIONS), unique("relay")
    before = write(pg.url, topic)
    lose_the_tail(pg, topic)
    job = start_relay(tmp_path, pg.url.raw, bootstrap, name)
    wait_for_events(bootstrap, topic, ids(before))
    pg.crash()
    pg.start()
    after = write(pg.url, topic)
    records = wait_for_events(bootstrap, topic, ids(before, after))
    assert_exactly_once(records, Committed.merged(before, after))
    assert "went back in time" not in job.output(), "a durable server's crash must not rewind the relay"
    assert terminate(job) == 0


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
def test_failover_to_a_promoted_replica_loses_no_event(
    tmp_path: Path, bootstrap: str, replication: str
) -> None:
    """A streaming replica (pg_basebackup -R) promoted after the primary is killed. The relay's URL
    names both servers, as HA setups do; it follows the primary. Synchronous: exactly once.
    Asynchronous: what the replica never received was published and is gone from the database
    (phantoms); the relay republishes from the last mark the replica holds, and loses nothing."""
    sync = replication == "synchronous"
    settings = {"wal_writer_delay": "10s"}
    primary = OwnPostgres(tmp_path / "primary", durable=True, settings=settings)
    replica: OwnPostgres | None = None
    try:
        migrate.upgrade(primary.url, "public")
        replica = primary.replica(tmp_path / "replica", synchronous=sync)
        both = (
            f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{replica.port}/postgres"
            "?target_session_attrs=read-write"
        )
        topic, name = create_topic(bootstrap, unique("events"), PARTITIONS), unique("relay")
        job = start_relay(tmp_path, both, bootstrap, name)
        first = write(primary.url, topic)
        wait_for_events(bootstrap, topic, ids(first))
        job.kill9()
        if not sync:
            replica.stop()  # it lags: nothing from here on reaches it
        second = write(primary.url, topic)
        lose_the_tail(primary, topic)
        job = start_relay(tmp_path, both, bootstrap, name)
        wait_for_events(bootstrap, topic, ids(first, second))
        primary.crash()
        if not sync:
            replica.start()
        replica.execute("SELECT pg_promote()")
        third = write(replica.url, topic)
        records = wait_for_events(bootstrap, topic, ids(first, third), timeout=120)
        if sync:
            assert_exactly_once(records, Committed.merged(first, second, third))
        else:
            assert_exactly_once(
                records, Committed.merged(first, third), may_repeat=ids(first), phantoms=ids(second)
            )
            assert "went back in time" in job.output()
        assert terminate(job) == 0
    finally:
        for server in (primary, replica):
            if server is not None:
                server.stop()


def test_a_restore_from_a_base_backup_loses_no_event(
    tmp_path: Path, durable_postgres: OwnPostgres, bootstrap: str
) -> None:
    """The server is brought back from a base backup taken before the relay's last batches: those
    batches' events are phantoms, their xids are handed out again, and the new events go out."""
    pg, topic, name = durable_postgres, create_topic(bootstrap, unique("events"), PARTITIONS), unique("relay")
    job = start_relay(tmp_path, pg.url.raw, bootstrap, name)
    first = write(pg.url, topic)
    wait_for_events(bootstrap, topic, ids(first))
    backup = pg.copy(tmp_path / "backup", standby=False)
    second = write(pg.url, topic)
    wait_for_events(bootstrap, topic, ids(first, second))
    pg.crash()
    restored = OwnPostgres(backup, port=pg.port, durable=True)
    try:
        third = write(restored.url, topic)
        records = wait_for_events(bootstrap, topic, ids(first, third))
        assert_exactly_once(
            records, Committed.merged(first, third), may_repeat=ids(first), phantoms=ids(second)
        )
        assert "went back in time" in job.output()
        assert terminate(job) == 0
    finally:
        restored.stop()


def test_a_relay_that_reaches_a_standby_waits_for_a_primary(
    tmp_path: Path, durable_postgres: OwnPostgres, bootstrap: str
) -> None:
    """During a failover the relay's URL may lead to a standby: one line, no traceback, and it
    publishes once the standby is promoted."""
    primary = durable_postgres
    replica = OwnPostgres(primary.copy(tmp_path / "replica", standby=True), durable=True)
    try:
        topic, name = create_topic(bootstrap, unique("events"), PARTITIONS), unique("relay")
        job = start_relay(tmp_path, replica.url.raw, bootstrap, name)
        job.wait_for_output("waiting for a primary", 60)
        events = write(primary.url, topic)
        lsn = primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        wait_for(
            lambda: replica.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn])[0][0],
            30,
            "the replica to replay the primary's events",
        )
        time.sleep(2)  # a few more rounds of waiting: still one line
        primary.crash()
        replica.execute("SELECT pg_promote()")
        assert_exactly_once(wait_for_events(bootstrap, topic, ids(events)), events)
        output = job.output()
        assert output.count("waiting for a primary") == 1 and "Traceback" not in output
        assert terminate(job) == 0
    finally:
        replica.stop()


def test_a_dump_restored_into_another_cluster_is_refused_until_rebased(
    tmp_path: Path, durable_postgres: OwnPostgres, bootstrap: str
) -> None:
    """pg_dump into a new cluster: its transaction ids mean something else, so the relay refuses it
    with one line naming `outbox relays rebase`; after the rebase every row left goes out again."""
    old, topic, name = (
        durable_postgres,
        create_topic(bootstrap, unique("events"), PARTITIONS),
        unique("relay"),
    )
    job = start_relay(tmp_path, old.url.raw, bootstrap, name)
    first = write(old.url, topic)
    wait_for_events(bootstrap, topic, ids(first))
    assert terminate(job) == 0
    second = write(old.url, topic)  # not yet published when the dump is taken
    new = OwnPostgres(tmp_path / "new", durable=True)
    try:
        dump = subprocess.run(
            [str(postgres.bin_dir() / "pg_dump"), "--dbname", old.url.libpq, "--format", "custom"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(
            [str(postgres.bin_dir() / "pg_restore"), "--dbname", new.url.libpq, "--no-owner"],
            input=dump,
            capture_output=True,
            check=True,
        )
        third = write(new.url, topic)
        refused = start_relay(tmp_path, new.url.raw, bootstrap, name)
        assert refused.wait(60) == 2
        assert "outbox: error: [RELAY_POSITION_OTHER_CLUSTER] " in refused.output()
        assert "outbox relays rebase --schema public" in refused.output()
        rebased = outbox("relays", "rebase", env={"DATABASE_URL": new.url.raw})
        assert "outbox rows will be published again" in rebased.out
        job = start_relay(tmp_path, new.url.raw, bootstrap, name)
        records = wait_for_events(bootstrap, topic, ids(first, second, third))
        assert_exactly_once(records, Committed.merged(first, second, third), may_repeat=ids(first))
        assert terminate(job) == 0
    finally:
        new.stop()
