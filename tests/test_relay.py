"""The relay against real PostgreSQL and Kafka: no gaps, exactly once, order per key, standby and fencing."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from core.config import DatabaseUrl
from outbox import migrate
from outbox.dev.kafka import Broker
from outbox.writer import Event, add_event, add_events
from tests.helpers import create_topic, read_committed, unique, wait_for
from tests.relay_support import (
    Committed,
    Writers,
    assert_exactly_once,
    murmur2_partition,
    published,
    relay_job,
    wait_published,
)

ACTIVE = "relay: active"


@pytest.fixture
def outbox_db(database: DatabaseUrl) -> DatabaseUrl:
    migrate.upgrade(database, "public")
    return database


@pytest.fixture
def env(outbox_db: DatabaseUrl, bootstrap: str) -> dict[str, str]:
    return {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}


@pytest.fixture
def events_topic(bootstrap: str) -> str:
    return create_topic(bootstrap, unique("events"), partitions=3)


def outbox_rows(url: DatabaseUrl) -> int:
    with psycopg.connect(url.libpq) as conn:
        return int(conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0])  # type: ignore[index]


def terminate(job) -> int:  # type: ignore[no-untyped-def]
    os.kill(job.process.pid, signal.SIGTERM)
    return job.wait(30)


def test_concurrent_writers_and_a_long_open_transaction(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    with psycopg.connect(outbox_db.libpq) as long, psycopg.connect(outbox_db.libpq) as aborted:
        # Opened first, so its row has the lowest id; it commits last, after everything else was published.
        long.execute("BEGIN")
        late = add_event(long, events_topic, {"late": True}, key="late")
        with aborted.transaction(force_rollback=True):
            add_event(aborted, events_topic, {"rolled": "back"}, key="late")

        writers = Writers(outbox_db, events_topic).start(transactions=60)
        job, _ = relay_job(tmp_path, env, unique("relay"), "--batch-size", "37")
        job.wait_for_output(ACTIVE, 60)
        writers.join()
        records = wait_published(bootstrap, events_topic, 3, writers.committed.count)
        assert str(late) not in {event for *_, event in records}, "published before its transaction committed"
        long.execute("COMMIT")

    committed: Committed = writers.committed
    committed.add("late", [str(late)])
    records = wait_published(bootstrap, events_topic, 3, committed.count)
    assert_exactly_once(records, committed)
    for partition, _, key, _ in records:
        assert partition == murmur2_partition(key.encode(), 3), "not the Java client's partition"
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup of published rows")

    assert terminate(job) == 0, job.output()
    assert "exiting" in job.output()


@pytest.mark.parametrize("point", ["before-produce", "mid-transaction", "before-commit", "before-cleanup"])
def test_kill9_at_each_point_of_a_batch(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str, point: str
) -> None:
    name = unique("relay")
    writers = Writers(outbox_db, events_topic).start(transactions=40, max_delay=0.005)
    writers.join()
    for _ in range(2):  # the second kill hits a relay that restarted from the first one's leftovers
        job, _ = relay_job(tmp_path, env, name, "--batch-size", "30", pause_at=point)
        job.wait_for_output(f"paused at {point}", 60)
        job.kill9()
    job, _ = relay_job(tmp_path, env, name, "--batch-size", "30")
    records = wait_published(bootstrap, events_topic, 3, writers.committed.count)
    assert_exactly_once(records, writers.committed)
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup of published rows")
    assert terminate(job) == 0


def test_kill9_at_random_moments_while_writers_write(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    name, rng = unique("relay"), random.Random()
    writers = Writers(outbox_db, events_topic).start(max_delay=0.01)
    try:
        for _ in range(10):
            job, _ = relay_job(tmp_path, env, name, "--batch-size", "25")
            job.wait_for_output(ACTIVE, 60)
            time.sleep(rng.uniform(0, 1.5))
            job.kill9()
    finally:
        writers.stop.set()
        writers.join()
    job, _ = relay_job(tmp_path, env, name)
    records = wait_published(bootstrap, events_topic, 3, writers.committed.count)
    assert writers.committed.count > 100
    assert_exactly_once(records, writers.committed)
    assert terminate(job) == 0


def test_standby_takes_over_and_the_old_instance_is_fenced(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    name = unique("relay")
    writers = Writers(outbox_db, events_topic).start(max_delay=0.01)
    try:
        first, _ = relay_job(tmp_path, env, name, label="first")
        first.wait_for_output(ACTIVE, 60)
        second, resume = relay_job(tmp_path, env, name, "--batch-size", "20", pause_at="mid-transaction")
        second.wait_for_output("standing by", 60)
        assert ACTIVE not in second.output()

        first.kill9()
        second.wait_for_output("paused at mid-transaction", 60)  # took over, half a batch sent

        # Make `second` a zombie: its session (and lock) ends while it is paused mid-transaction.
        with psycopg.connect(outbox_db.libpq, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                [f"outbox-relay {name}"],
            )
        third, _ = relay_job(tmp_path, env, name, label="third")
        third.wait_for_output(ACTIVE, 60)
        time.sleep(1)
        resume.touch()
        second.wait_for_output("fenced", 60)
        second.wait_for_output("standing by", 60)
    finally:
        writers.stop.set()
        writers.join()
    records = wait_published(bootstrap, events_topic, 3, writers.committed.count)
    assert_exactly_once(records, writers.committed)
    assert terminate(third) == 0
    assert terminate(second) == 0


def test_shards_split_the_keys_and_together_publish_everything(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    name = unique("relay")
    writers = Writers(outbox_db, events_topic, keys_per_writer=8).start(transactions=40)
    jobs = [relay_job(tmp_path, env, name, "--shard", f"{i}/3")[0] for i in range(3)]
    writers.join()
    records = wait_published(bootstrap, events_topic, 3, writers.committed.count)
    assert_exactly_once(records, writers.committed)
    for job in jobs:
        assert terminate(job) == 0
    # Each shard committed its own positions.
    keys = {key.decode() for _, _, key, _ in read_committed(bootstrap, "outbox-relay-positions", 1)}
    with psycopg.connect(outbox_db.libpq) as conn:
        outbox = conn.execute("SELECT id::text FROM outbox_identity").fetchone()[0]  # type: ignore[index]
    assert {k for k in keys if k.startswith(f"{name}/")} == {f"{name}/{outbox}/{i}-of-3" for i in range(3)}

    wrong, _ = relay_job(tmp_path, env, name, "--shard", "0/2")
    assert wrong.wait(60) == 2
    assert "already has positions for 3 shard(s)" in wrong.output()


def test_poison_rows_halt_by_default_and_dead_letter_on_request(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    missing_topic = unique("missing")
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, [Event(events_topic, {"n": 1}, key="a"), Event(events_topic, {"n": 2}, key="a")])
        add_event(conn, missing_topic, {"n": 3}, key="a")
        add_event(conn, events_topic, b"x" * 2_000_000, key="a")  # over the broker's 1 MB limit
        add_event(conn, events_topic, {"n": 5}, key="a")

    name = unique("relay")
    # Batches of 2 are full, so each poison row is met with the next part already read ahead.
    halted, _ = relay_job(tmp_path, env, name, "--batch-size", "2")
    halted.wait_for_output("halted on a poison row", 60)
    assert f"topic {missing_topic!r} does not exist" in halted.output()
    assert len(published(bootstrap, events_topic, 3)) == 2  # the rows before the poison row, nothing after
    assert terminate(halted) == 0

    job, _ = relay_job(
        tmp_path,
        env,
        name,
        "--batch-size",
        "2",
        "--on-poison",
        "dead-letter",
        "-X",
        "message.max.bytes=4000000",
    )
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) == 3, 60, "the row after the poison rows")
    with psycopg.connect(outbox_db.libpq) as conn:
        dead = conn.execute(
            "SELECT topic, length(value), error FROM relay_dead_letters ORDER BY outbox_id"
        ).fetchall()
    assert [(t, n > 1_000_000) for t, n, _ in dead] == [(missing_topic, False), (events_topic, True)]
    assert "does not exist" in dead[0][2] and "larger than Kafka accepts" in dead[1][2]
    # A refused record used up a sequence number: the next transaction must not trip over the gap.
    assert "session ended" not in job.output(), job.output()
    assert terminate(job) == 0


@pytest.fixture
def private_services(tmp_path: Path, own_broker: Broker) -> Iterator[dict[str, object]]:
    """A PostgreSQL and a Kafka of this test's own, so it can restart them."""
    from outbox.dev import postgres
    from outbox.dev.process import free_port, stop

    pg = postgres.start(tmp_path / "pg", free_port(), die_with_parent=True)
    started = {"postgres": pg}
    yield {"services": started, "tmp": tmp_path, "broker": own_broker}
    stop(started["postgres"].pid, signal.SIGINT, timeout=30)


def _start_relay(private_services: dict) -> tuple:  # type: ignore[type-arg]
    tmp, services = private_services["tmp"], private_services["services"]
    url = DatabaseUrl.parse(services["postgres"].env["DATABASE_URL"])
    bootstrap = private_services["broker"].bootstrap
    migrate.upgrade(url, "public")
    topic = create_topic(bootstrap, unique("events"), partitions=3)
    env = {"DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    job, _ = relay_job(tmp, env, "restarts", "--batch-size", "20")
    job.wait_for_output(ACTIVE, 60)
    return tmp, services, url, bootstrap, topic, job


def test_postgres_restart_mid_run(private_services: dict) -> None:  # type: ignore[type-arg]
    from outbox.dev import postgres
    from outbox.dev.process import stop

    tmp, services, url, bootstrap, topic, job = _start_relay(private_services)
    # Postgres goes down with committed rows not yet published, and comes back.
    first = Writers(url, topic).start(transactions=25)
    first.join()
    old = services["postgres"]
    stop(old.pid, signal.SIGINT, timeout=30)
    time.sleep(2)
    services["postgres"] = postgres.start(tmp / "pg", old.port, die_with_parent=True)
    second = Writers(url, topic).start(transactions=25)
    second.join()
    committed = Committed()
    for writers in (first, second):
        for key, ids in writers.committed.by_key.items():
            committed.add(key, ids)
    assert_exactly_once(wait_published(bootstrap, topic, 3, committed.count), committed)
    assert "session ended, retrying" in job.output()
    assert terminate(job) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_broker_restart_mid_run(private_services: dict, sig: int) -> None:  # type: ignore[type-arg]
    _, _, url, bootstrap, topic, job = _start_relay(private_services)
    # Writers keep committing through the whole outage and after it, so batches are in
    # flight when the broker goes and rows pile up while it is away.
    writers = Writers(url, topic).start(max_delay=0.05)
    wait_for(lambda: writers.committed.count > 40, 30, "writers under way")
    before = writers.committed.count
    private_services["broker"].restart(sig)
    during = writers.committed.count
    time.sleep(2)
    writers.stop.set()
    writers.join()
    assert before < during < writers.committed.count, "writers did not span the outage"
    # The relay rides the outage out inside librdkafka's retries, or ends its session and
    # starts over from the position in Kafka; either way every event is there once.
    assert_exactly_once(wait_published(bootstrap, topic, 3, writers.committed.count, 120), writers.committed)
    assert terminate(job) == 0


def test_broker_killed_with_a_transaction_open_that_then_times_out(private_services: dict) -> None:  # type: ignore[type-arg]
    """The relay's open transaction dies with the broker and is aborted at its timeout: the late commit
    must fail, and the relay must start over from the position in Kafka, not take the batch as sent."""
    tmp, services = private_services["tmp"], private_services["services"]
    url = DatabaseUrl.parse(services["postgres"].env["DATABASE_URL"])
    broker = private_services["broker"]
    migrate.upgrade(url, "public")
    topic = create_topic(broker.bootstrap, unique("events"), partitions=3)
    env = {"DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
    writers = Writers(url, topic).start(transactions=10)
    writers.join()
    job, resume = relay_job(
        tmp, env, "late", "--batch-size", "20", "-X", "transaction.timeout.ms=4000", pause_at="before-commit"
    )
    job.wait_for_output("paused at before-commit", 60)
    broker.restart(signal.SIGKILL)
    time.sleep(6)  # past the transaction's timeout: the restarted broker aborts it
    resume.touch()
    assert_exactly_once(
        wait_published(broker.bootstrap, topic, 3, writers.committed.count, 120), writers.committed
    )
    assert "session ended, retrying" in job.output()
    assert terminate(job) == 0


def test_the_same_name_on_two_schemas_publishes_each_outbox_exactly_once(
    tmp_path: Path, database: DatabaseUrl, bootstrap: str, events_topic: str
) -> None:
    """The reproduction of a data loss: one --name on two schemas used to share a position and fence."""
    env = {"DATABASE_URL": database.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    committed = {schema: Committed() for schema in ("a", "b")}

    def write(count: int) -> None:
        with psycopg.connect(database.libpq) as conn:
            for schema, done in committed.items():
                for n in range(count):
                    key = f"{schema}-k{n % 7}"
                    with conn.transaction():
                        ids = add_events(conn, [Event(events_topic, {"n": n}, key=key)], schema=schema)
                    done.add(key, [str(i) for i in ids])

    for schema in committed:
        migrate.upgrade(database, schema)
    name = unique("shared")
    first, _ = relay_job(tmp_path, env, name, "--schema", "a", label="a")
    first.wait_for_output(ACTIVE, 60)
    write(100)
    second, _ = relay_job(tmp_path, env, name, "--schema", "b", label="b")
    second.wait_for_output(ACTIVE, 60)
    write(100)

    records = wait_published(bootstrap, events_topic, 3, 400)
    for schema, done in committed.items():
        assert_exactly_once([r for r in records if r[2].startswith(f"{schema}-")], done)
    assert "fenced" not in first.output() + second.output()
    assert terminate(first) == 0 and terminate(second) == 0
