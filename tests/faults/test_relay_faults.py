"""The relay under failure: kill -9 at each point of a batch and at random, PostgreSQL and broker restarts.

Every test checks the published records one by one against what was committed.
"""

from __future__ import annotations

import random
import signal
import time
import unicodedata
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox.relay.pause import BEFORE_COMMIT, BEFORE_PRODUCE, MID_TRANSACTION
from outbox.writer import Event, add_events
from outbox_dev.kafka import Broker
from tests.helpers import Job, OwnPostgres, create_topic, unique, wait_for
from tests.relay_support import (
    ACTIVE,
    Committed,
    Writers,
    assert_exactly_once,
    check_two_readers,
    outbox_rows,
    relay_job,
    terminate,
    wait_published,
)


@pytest.mark.parametrize("point", ["before-produce", "mid-transaction", "before-commit", "before-cleanup"])
def test_kill9_at_each_point_of_a_batch(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str, point: str
) -> None:
    # A name with quotes, SQL, non-ASCII and an emoji, in NFD: it must find its own position again.
    name = unique(unicodedata.normalize("NFD", "we\"ird 'näme' ✓ x;-- 🚀"))
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


@pytest.mark.parametrize("point", [MID_TRANSACTION, BEFORE_COMMIT])
def test_kill9_inside_a_transaction_larger_than_a_batch(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str, point: str
) -> None:
    """One transaction of 200 events written with one COPY, published in batches of 30, three relays
    each killed -9 after its first batch (before it produces its second), then one at `point` of
    its first.

    A COPY's rows share WAL positions, a page's worth each: a CDC reader that resumes from a
    position inside such a group skips the rest of it (Debezium 3.6, debezium/dbz#1554). The
    relay resumes from its own position inside the transaction's rows."""
    events = [Event(events_topic, {"n": i}, key=f"k{i % 7}") for i in range(200)]
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, events)
    committed = Committed()
    for e in events:
        committed.add(str(e.key), [str(e.event_id)])
    name = unique("relay")
    after_one = f"{BEFORE_PRODUCE}#2"  # a batch committed, the next not begun
    for at in (after_one, after_one, after_one, point):
        job, _ = relay_job(tmp_path, env, name, "--batch-size", "30", pause_at=at)
        job.wait_for_output(f"paused at {at}", 60)
        job.kill9()
    job, _ = relay_job(tmp_path, env, name, "--batch-size", "30")
    check_two_readers(bootstrap, events_topic, 3, committed, outbox_db)
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


def start_relay(
    tmp: Path, url: DatabaseUrl, bootstrap: str, *flags: str, pause_at: str = "none"
) -> tuple[str, Job, Path]:
    """A topic, and a relay on the given services (paused where `pause_at` says)."""
    topic = create_topic(bootstrap, unique("events"), partitions=3)
    env = {"DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    job, resume = relay_job(tmp, env, "restarts", "--batch-size", "20", *flags, pause_at=pause_at)
    return topic, job, resume


def test_postgres_restart_mid_run(tmp_path: Path, own_postgres: OwnPostgres, bootstrap: str) -> None:
    url = own_postgres.url
    topic, job, _ = start_relay(tmp_path, url, bootstrap)
    job.wait_for_output(ACTIVE, 60)
    # Postgres goes down with committed rows not yet published, and comes back.
    first = Writers(url, topic).start(transactions=25)
    first.join()
    own_postgres.restart()
    second = Writers(url, topic).start(transactions=25)
    second.join()
    committed = Committed.merged(first.committed, second.committed)
    assert_exactly_once(wait_published(bootstrap, topic, 3, committed.count), committed)
    assert "session ended, retrying" in job.output()
    assert terminate(job) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_broker_restart_mid_run(tmp_path: Path, outbox_db: DatabaseUrl, own_broker: Broker, sig: int) -> None:
    url, bootstrap = outbox_db, own_broker.bootstrap
    topic, job, _ = start_relay(tmp_path, url, bootstrap)
    job.wait_for_output(ACTIVE, 60)
    # Writers keep committing through the whole outage and after it, so batches are in
    # flight when the broker goes and rows pile up while it is away.
    writers = Writers(url, topic).start(max_delay=0.05)
    wait_for(lambda: writers.committed.count > 40, 30, "writers under way")
    before = writers.committed.count
    own_broker.restart(sig)
    during = writers.committed.count
    time.sleep(2)
    writers.stop.set()
    writers.join()
    assert before < during < writers.committed.count, "writers did not span the outage"
    # The relay rides the outage out inside librdkafka's retries, or ends its session and
    # starts over from the position in Kafka; either way every event is there once.
    assert_exactly_once(wait_published(bootstrap, topic, 3, writers.committed.count, 120), writers.committed)
    assert terminate(job) == 0


def test_broker_killed_with_a_transaction_open_that_then_times_out(
    tmp_path: Path, outbox_db: DatabaseUrl, own_broker: Broker
) -> None:
    """The relay's open transaction dies with the broker and is aborted at its timeout: the late commit
    must fail, and the relay must start over from the position in Kafka, not take the batch as sent."""
    url, broker = outbox_db, own_broker
    topic, job, resume = start_relay(
        tmp_path, url, broker.bootstrap, "-X", "transaction.timeout.ms=4000", pause_at="before-commit"
    )
    writers = Writers(url, topic).start(transactions=10)
    writers.join()
    job.wait_for_output("paused at before-commit", 60)
    broker.restart(signal.SIGKILL)
    time.sleep(6)  # past the transaction's timeout: the restarted broker aborts it
    resume.touch()
    assert_exactly_once(
        wait_published(broker.bootstrap, topic, 3, writers.committed.count, 120), writers.committed
    )
    assert "session ended, retrying" in job.output()
    assert terminate(job) == 0


def test_a_prepared_transaction_outlives_a_crash_and_a_relay_kill_then_commits_once(
    tmp_path: Path, bootstrap: str
) -> None:
    """Two-phase commit, as Java transaction managers (XA) use it: a PREPAREd transaction survives a
    crash of the server still open, and commits or rolls back whenever its coordinator says, here
    after the server's crash, the relay's kill -9 and a restart that found it open in its position."""
    pg = OwnPostgres(tmp_path / "pg", durable=True)
    try:
        migrate.upgrade(pg.url, "public")
        topic, job, _ = start_relay(tmp_path, pg.url, bootstrap)
        job.wait_for_output(ACTIVE, 60)
        late = prepare(pg.url, "to-commit", [Event(topic, {"n": i}, key="late") for i in range(3)])
        prepare(pg.url, "to-roll-back", [Event(topic, {"rolled": "back"}, key="late")], by_sql=True)
        first = Writers(pg.url, topic).start(transactions=20, max_delay=0.005)
        first.join()
        wait_published(bootstrap, topic, 3, first.committed.count)
        pg.crash()
        job.kill9()
        pg.start()
        env = {"DATABASE_URL": pg.url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        job, _ = relay_job(tmp_path, env, "restarts", "--batch-size", "20")
        second = Writers(pg.url, topic).start(transactions=20, max_delay=0.005)
        second.join()
        committed = Committed.merged(first.committed, second.committed)
        records = wait_published(bootstrap, topic, 3, committed.count)
        assert not {str(e.event_id) for e in late} & {e for *_, e in records}, "published while prepared"
        with psycopg.connect(pg.url.libpq, autocommit=True) as conn:
            conn.execute("COMMIT PREPARED 'to-commit'")
            conn.execute("ROLLBACK PREPARED 'to-roll-back'")
        committed.add("late", [str(e.event_id) for e in late])
        check_two_readers(bootstrap, topic, 3, committed, pg.url)
        assert terminate(job) == 0
    finally:
        pg.stop()


def prepare(url: DatabaseUrl, gid: str, events: list[Event], by_sql: bool = False) -> list[Event]:
    """`events` written in a transaction left PREPAREd as `gid`, to be committed or rolled back later.

    The outbox's NOTIFY is turned off by the writer, or `by_sql` as a writer in another language would."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("BEGIN")
        if by_sql:
            conn.execute("SET LOCAL outbox.notify = off")
        add_events(conn, events, notify=by_sql)
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    return events


def test_a_rewrite_of_the_outbox_under_a_read_loses_no_event(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """An ALTER TABLE that rewrites the table (a volatile default, a new type; pg_repack's swap) gives
    every row the rewriting transaction's id, so a snapshot taken before it committed sees the table
    empty (PostgreSQL's documented caveat). A read that took its snapshot, then waited for the
    rewrite's lock, must not take the delta for empty and go past its events."""
    job, _ = relay_job(tmp_path, env, unique("relay"), "--poll-interval", "3600")  # reads when woken
    job.wait_for_output(ACTIVE, 60)
    before = [Event(events_topic, {"n": i}, key=f"k{i % 3}") for i in range(5)]
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, before, notify=False)  # committed, and the relay not woken for them
    with (
        psycopg.connect(outbox_db.libpq) as rewrite,
        psycopg.connect(outbox_db.libpq, autocommit=True) as other,
    ):
        rewrite.execute("ALTER TABLE outbox_events ADD COLUMN rewritten uuid DEFAULT gen_random_uuid()")
        other.execute(
            "SELECT pg_notify('outbox_events', 'public')"
        )  # the relay reads, and waits for the lock
        wait_for(
            lambda: (
                other.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'outbox_events'::regclass"
                ).fetchone()[0]  # type: ignore[index]
                > 0
            ),
            30,
            "the relay's read waiting for the rewrite",
        )
        rewrite.commit()
    after = Event(events_topic, {"n": 5}, key="k0")
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, [after])
    committed = Committed()
    for e in (*before, after):
        committed.add(str(e.key), [str(e.event_id)])
    check_two_readers(bootstrap, events_topic, 3, committed, outbox_db)
    assert terminate(job) == 0


def test_a_batch_that_fails_after_the_next_delta_was_read_loses_nothing_to_another_relays_cleanup(
    tmp_path: Path, outbox_db: DatabaseUrl, bootstrap: str, own_broker: Broker
) -> None:
    """Two relay names on one outbox, each to its own Kafka cluster. The slow one reads the next
    delta while it publishes the end of this one; reading a delta records its base as published for
    the other relays' cleanup. Recorded before that end was in Kafka, the fast relay's cleanup
    deleted rows the slow one then failed to publish (here: halted on a topic its cluster lacks,
    killed -9, restarted once the topic is there)."""
    url, slow_kafka, fast_kafka = outbox_db, own_broker.bootstrap, bootstrap
    topic, missing = unique("events"), unique("late-topic")
    for cluster in (slow_kafka, fast_kafka):
        create_topic(cluster, topic, partitions=3)
    create_topic(fast_kafka, missing, partitions=3)  # the slow relay's cluster lacks it, for now
    first = [Event(missing if i == 14 else topic, {"n": i}, key=f"k{i % 4}") for i in range(20)]
    with psycopg.connect(url.libpq) as conn:
        add_events(conn, first)
    slow_env = {"DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": slow_kafka}
    slow_name = unique("slow")
    slow, resume = relay_job(tmp_path, slow_env, slow_name, "--batch-size", "10", pause_at=BEFORE_PRODUCE)
    slow.wait_for_output(f"paused at {BEFORE_PRODUCE}", 60)  # its first batch: rows 1-10 of 20
    second = [Event(topic, {"n": i}, key=f"k{i % 4}") for i in range(20, 25)]
    with psycopg.connect(url.libpq) as conn:
        add_events(conn, second)  # the next delta, for the slow relay to read ahead
    resume.touch()
    slow.wait_for_output("halted on a poison row", 60)  # rows 11-14 published, row 15 refused
    fast_env = {"DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": fast_kafka}
    fast, _ = relay_job(tmp_path, fast_env, unique("fast"))
    committed = Committed()
    for e in (*first, *second):
        if e.topic == topic:
            committed.add(str(e.key), [str(e.event_id)])
    assert_exactly_once(wait_published(fast_kafka, topic, 3, committed.count), committed)
    time.sleep(3)  # rounds of the fast relay's cleanup
    slow.kill9()
    create_topic(slow_kafka, missing, partitions=3)
    slow, _ = relay_job(tmp_path, slow_env, slow_name, "--batch-size", "10")
    assert_exactly_once(wait_published(slow_kafka, topic, 3, committed.count, timeout=60), committed)
    assert [e for *_, e in wait_published(slow_kafka, missing, 3, 1, timeout=30)] == [str(first[14].event_id)]
    assert terminate(slow) == 0 and terminate(fast) == 0


def test_a_relay_on_a_logical_subscriber_publishes_every_row_replication_brings(
    tmp_path: Path, own_postgres: OwnPostgres, bootstrap: str, events_topic: str
) -> None:
    """A move to a new cluster by logical replication (a major-version upgrade, a blue/green
    cutover), the relay on the subscriber. Replication's apply skips ordinary triggers, so 0010's
    stamp did not run there: a row kept the id of the publisher's transaction, which means nothing
    in the subscriber's snapshots. With the subscriber's ids ahead of the publisher's, the relay
    took each replicated row for published long ago, never read it, and cleanup deleted it."""
    subscriber = own_postgres
    publisher = OwnPostgres(tmp_path / "publisher")
    try:
        migrate.upgrade(publisher.url, "public")
        publisher.execute("CREATE PUBLICATION outbox FOR TABLE outbox_events")
        with psycopg.connect(subscriber.url.libpq, autocommit=True) as conn:
            for _ in range(3000):  # the subscriber's transaction ids well ahead of the publisher's
                conn.execute("SELECT pg_current_xact_id()")
            # Replication copies no sequence: the subscriber's own rows take ids past the publisher's.
            conn.execute("SELECT setval(pg_get_serial_sequence('outbox_events', 'id'), 1000000)")
            connection = sql.Literal(publisher.url.libpq)
            conn.execute(
                sql.SQL("CREATE SUBSCRIPTION outbox CONNECTION {} PUBLICATION outbox").format(connection)
            )
        local = Writers(subscriber.url, events_topic).start(transactions=5)
        local.join()
        env = {"DATABASE_URL": subscriber.url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        job, _ = relay_job(tmp_path, env, unique("relay"))
        wait_published(bootstrap, events_topic, 3, local.committed.count)  # the relay has a base
        replicated = Writers(publisher.url, events_topic).start(transactions=20)
        replicated.join()
        committed = Committed.merged(local.committed, replicated.committed)
        check_two_readers(bootstrap, events_topic, 3, committed, subscriber.url, timeout=60)
        assert terminate(job) == 0
    finally:
        subscriber.execute("DROP SUBSCRIPTION IF EXISTS outbox")
        publisher.stop()
