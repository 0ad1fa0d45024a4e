"""The relay against real PostgreSQL and Kafka: no gaps, exactly once, order per key, standby and fencing."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox.relay.outbox_table import OutboxTable, lock_key, opened
from outbox.relay.position import Position, Shard
from outbox.writer import Event, add_event, add_events
from outbox_dev.kafka import Broker
from tests.cli import outbox
from tests.helpers import create_topic, read_committed, transactional_producer, unique, wait_for
from tests.relay_support import (
    ACTIVE,
    Committed,
    Writers,
    assert_exactly_once,
    murmur2_partition,
    outbox_rows,
    published,
    relay_job,
    terminate,
    wait_published,
)


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


def test_a_relay_held_mid_transaction_holds_another_names_start_only_until_it_ends_and_says_so(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """Relays of two names share a positions topic, each reading it read_committed: one held with
    its position produced and not committed holds the topic's stable end, and the other, started
    meanwhile, cannot read its own position past it. It says so in one line within seconds (before,
    nothing until it gave up), and starts as soon as the held transaction commits."""
    positions = unique("positions")
    with psycopg.connect(outbox_db.libpq) as conn:
        ids = add_events(conn, [Event(events_topic, {"n": i}, key=f"k{i}") for i in range(10)])
    held, resume = relay_job(
        tmp_path, env, unique("held"), "--positions-topic", positions, pause_at="before-commit", label="held"
    )
    held.wait_for_output("paused at before-commit", 60)
    other, _ = relay_job(tmp_path, env, unique("other"), "--positions-topic", positions, label="other")
    other.wait_for_output(f"the positions topic '{positions}' is held by a transaction still open", 30)
    assert ACTIVE not in other.output()
    resume.touch()
    released = time.monotonic()
    other.wait_for_output(ACTIVE, 30)
    started = time.monotonic() - released
    # Each name publishes the whole outbox once: every event twice, none more.
    records = wait_published(bootstrap, events_topic, 3, 2 * len(ids))
    assert sorted(e for *_, e in records) == sorted(str(i) for i in ids for _ in range(2))
    assert terminate(other) == 0 and terminate(held) == 0
    print(f"the other relay became active {started:.1f} s after the held transaction was let go")


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
    assert "outbox: error: [RELAY_SHARD_COUNT_CHANGED] " in wrong.output()


def test_another_shard_count_under_one_name_is_refused_before_it_has_published_anything(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """The shard count was checked against the positions in Kafka only. A layout that had published
    nothing yet (empty deltas write no position), or whose positions topic was lost, left none
    there: 0/2 and 1/2 went active beside a running 0/1, and every event went out once from each."""
    name = unique("relay")
    first, _ = relay_job(tmp_path, env, name, "--shard", "0/1")
    first.wait_for_output(ACTIVE, 60)  # recorded in relay_positions, nothing in Kafka
    other, _ = relay_job(tmp_path, env, name, "--shard", "0/2")
    assert other.wait(60) == 2, other.output()
    assert "outbox: error: [RELAY_SHARD_COUNT_CHANGED] " in other.output()
    with psycopg.connect(outbox_db.libpq) as conn:
        sent = add_event(conn, events_topic, {"n": 1}, key="a")
    assert [e for *_, e in wait_published(bootstrap, events_topic, 3, 1)] == [str(sent)]
    assert terminate(first) == 0


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
        "--topic-wait",
        "0",
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


def test_a_poison_row_met_while_publishing_up_to_another_halts_at_the_first(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """A batch's rows are looked at (topic, headers) before any is sent; a row over Kafka's size
    limit shows only as it is sent. Halting on the missing topic of row 3, the relay sent the rows
    before it, met row 2's size, and exited with code 2: at every start again (a crash loop)."""
    missing_topic = unique("missing")
    with psycopg.connect(outbox_db.libpq) as conn:
        first = add_event(conn, events_topic, {"n": 1}, key="a")
        add_event(conn, events_topic, b"x" * 2_000_000, key="a")  # over the producer's 1 MB limit
        add_event(conn, missing_topic, {"n": 3}, key="a")
        add_event(conn, events_topic, {"n": 4}, key="a")
    job, _ = relay_job(tmp_path, env, unique("relay"))
    job.wait_for_output("halted on a poison row", 60)
    assert "larger than Kafka accepts" in job.output(), job.output()
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(first)], "the row before it"
    assert job.process.poll() is None, job.output()
    assert terminate(job) == 0


def test_dead_lettering_waits_for_a_topic_created_late(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """With --on-poison dead-letter, a row whose topic did not exist yet (events written before the
    topic was made, or while it was deleted and made again) was dead-lettered at once: never
    published, and no command publishes a dead letter. A missing or unwritable topic is waited
    for, --topic-wait seconds, before its rows are dead-lettered; a record Kafka refuses is not."""
    late = unique("late")
    with psycopg.connect(outbox_db.libpq) as conn:
        first = add_event(conn, late, {"n": 1}, key="a")
        after = add_event(conn, events_topic, {"n": 2}, key="a")
    job, _ = relay_job(tmp_path, env, unique("relay"), "--on-poison", "dead-letter", "--topic-wait", "120")
    job.wait_for_output("waiting for its topic", 60)
    assert published(bootstrap, events_topic, 3) == [], "nothing after the row waited on"
    create_topic(bootstrap, late)
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) == 1, 90, "the rows, once the topic exists")
    assert [e for *_, e in published(bootstrap, late, 1)] == [str(first)]
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(after)]
    with psycopg.connect(outbox_db.libpq) as conn:
        assert conn.execute("SELECT count(*) FROM relay_dead_letters").fetchone() == (0,)
    assert terminate(job) == 0


def test_a_topic_waited_for_once_is_not_waited_for_again_by_each_of_its_rows(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """The wait is the topic's: its later rows, while it is still missing, are dead-lettered at once,
    or a topic deleted for good held every other topic's events --topic-wait a row."""
    gone = unique("gone")
    with psycopg.connect(outbox_db.libpq) as conn:
        rows = [add_event(conn, gone, {"n": n}, key="a") for n in range(3)]
        after = add_event(conn, events_topic, {"n": 9}, key="a")
    job, _ = relay_job(tmp_path, env, unique("relay"), "--on-poison", "dead-letter", "--topic-wait", "2")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) == 1, 60, "the row after them")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(after)]
    with psycopg.connect(outbox_db.libpq) as conn:
        dead = conn.execute("SELECT event_id::text FROM relay_dead_letters ORDER BY outbox_id").fetchall()
    assert [d for (d,) in dead] == [str(r) for r in rows]
    waits = [line for line in job.output().splitlines() if "waiting for its topic" in line]
    assert waits and all("row_id=1 " in line or line.endswith("row_id=1") for line in waits), waits
    assert terminate(job) == 0


def test_rows_written_by_hand_that_kafka_cannot_take_as_written_are_poison_rows(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """Applications in other languages INSERT rows by hand. Header arrays of two lengths, or of two
    dimensions, ended the relay's process with a traceback, again at every start (a stuck relay);
    a NULL header name went out as the header "None"; names without values dropped the values;
    a header named event_id went out beside the relay's own, and readers that take the last one
    took the application's; a row for the relay's own positions topic went into it."""
    bad = [
        ("{a,b}", "{x}", events_topic),  # two names, one value
        ("{{a},{b}}", "{{x},{y}}", events_topic),  # two dimensions
        ("{NULL}", "{x}", events_topic),
        ("{}", "{x}", events_topic),
        ("{event_id}", "{x}", events_topic),
        ("{}", "{}", "outbox-relay-positions"),
        ("{}", "{}", "no such name"),
    ]
    with psycopg.connect(outbox_db.libpq) as conn:
        first = add_event(conn, events_topic, {"n": 0}, key="a")
        for keys, values, topic in bad:
            conn.execute(
                "INSERT INTO outbox_events (event_id, topic, key, value, header_keys, header_values)"
                " VALUES (gen_random_uuid(), %s, 'a', 'v', %s::text[], %s::bytea[])",
                [topic, keys, values],
            )
        last = add_event(conn, events_topic, {"n": 9}, key="a", headers={"h": "v"})
    job, _ = relay_job(tmp_path, env, unique("relay"), "--on-poison", "dead-letter")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) == 2, 60, "the two good rows")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(first), str(last)]
    with psycopg.connect(outbox_db.libpq) as conn:
        dead = [r[0] for r in conn.execute("SELECT error FROM relay_dead_letters ORDER BY outbox_id")]
    assert len(dead) == len(bad), dead
    for said, why in zip(
        dead,
        [
            "differ in length (2 and 1)",
            "one-dimensional",
            "a header name is NULL",
            "differ in length (0 and 1)",
            "event_id",
            "positions topic",
            "no name Kafka takes",
        ],
        strict=True,
    ):
        assert why in said, (why, said)
    assert "Traceback" not in job.output(), job.output()
    assert terminate(job) == 0


def test_a_row_written_by_hand_with_a_transaction_id_of_its_own_is_published(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """The relay reads rows by the id of the transaction that wrote them (`txid`). An INSERT that
    sets it (a copy of another row, an ORM that writes every column) gave a row the relay took for
    published long ago, or one it would not read for a billion transactions: lost, and nothing said."""
    job, _ = relay_job(tmp_path, env, unique("relay"))
    with psycopg.connect(outbox_db.libpq) as conn:
        first = add_event(conn, events_topic, {"n": 0}, key="a")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) == 1, 60, "the first row")
    with psycopg.connect(outbox_db.libpq) as conn:
        hand = [
            conn.execute(
                "INSERT INTO outbox_events (txid, event_id, topic, key, value)"
                " VALUES (%s::xid8, gen_random_uuid(), %s, 'a', 'v') RETURNING event_id::text",
                [txid, events_topic],
            ).fetchone()[0]  # type: ignore[index]
            for txid in ("3", str(2**40))
        ]
        last = add_event(conn, events_topic, {"n": 9}, key="a")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) >= 4, 60, "the rows written by hand")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(first), *hand, str(last)]
    assert terminate(job) == 0


def test_notifications_do_not_pile_up_in_a_standby_or_between_reads(outbox_db: DatabaseUrl) -> None:
    """psycopg keeps each NOTIFY a query meets until it is waited for, in a list without bound. A
    standby listened and never waited, and a relay halted on a poison row or catching up on a
    backlog did not wait for hours: at 100 commits a second, about 2 GB a day."""
    name = unique("relay")
    active, standby = (OutboxTable(outbox_db, "public", name, Shard(0, 1)) for _ in range(2))
    with opened(active), opened(standby), psycopg.connect(outbox_db.libpq, autocommit=True) as writer:
        assert active.try_lock() and not standby.try_lock()

        def listening(table: OutboxTable) -> bool:
            return bool(table.conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0])  # type: ignore[index]

        assert listening(active) and not listening(standby)
        for n in range(300):
            with writer.transaction():
                add_event(writer, "t", {"n": n})  # a commit each, a NOTIFY each
        time.sleep(0.5)  # the server has sent them: the next query takes them in
        active.fetch(Position(), 10, 2**20)
        assert not list(active.conn.notifies(timeout=0)), "the read took them in and kept them"


def test_a_halted_relay_that_now_stands_by_says_so_in_its_metrics(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str]
) -> None:
    """`outbox_relay_halted` and `outbox_relay_lag_seconds` were reset only by a published batch. A
    relay halted on a poison row whose session then ended, another instance taking over, went on
    saying 1 and its old lag for as long as it stood by: weeks of alerts about a relay not publishing."""
    with psycopg.connect(outbox_db.libpq) as conn:
        add_event(conn, unique("missing"), {"n": 1}, key="a")
    name = unique("relay")
    job, _ = relay_job(tmp_path, env, name, "--database-timeout", "3")  # a halt of ~10 s
    job.wait_for_output("halted on a poison row", 60)
    served = re.search(r"/healthz url=(\S+)", job.output())
    assert served, job.output()

    def scrape(path: str) -> str:
        try:
            return urllib.request.urlopen(served[1] + path, timeout=5).read().decode()
        except urllib.error.HTTPError as answer:  # 503 while not healthy
            return answer.read().decode()

    def gauge(metric: str) -> float:
        found = re.search(rf"^{metric}{{[^}}]*}} (\S+)$", scrape("/metrics"), re.M)
        assert found, scrape("/metrics")
        return float(found[1])

    assert gauge("outbox_relay_halted") == 1 and (lag := gauge("outbox_relay_lag_seconds")) > 0
    # The row waits on, and grows older: the lag was the age the row had when the relay halted.
    time.sleep(1.5)
    assert gauge("outbox_relay_lag_seconds") >= lag + 1.5
    with psycopg.connect(outbox_db.libpq, autocommit=True) as other:
        other.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [f"outbox-relay {name}"],
        )
        other.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", [lock_key("public", name, Shard(0, 1))]
        )
        wait_for(lambda: scrape("/healthz").strip() == "standby", 60, "the relay standing by")
        assert (gauge("outbox_relay_halted"), gauge("outbox_relay_lag_seconds")) == (0, 0)
    assert terminate(job) == 0


def test_a_row_written_by_hand_with_an_id_the_relay_cannot_read_is_refused(outbox_db: DatabaseUrl) -> None:
    """The relay reads a delta along the primary key from past id 0. A row given an id at or
    below 0 (OVERRIDING SYSTEM VALUE, a copy from another table) was never read, then deleted by
    cleanup: lost without a word. The table now refuses it, naming why."""
    with psycopg.connect(outbox_db.libpq) as conn:
        for id in (0, -1, -(2**63)):
            with pytest.raises(psycopg.errors.CheckViolation, match="outbox_events_id_positive"):
                conn.execute(
                    "INSERT INTO outbox_events (id, event_id, topic, value) OVERRIDING SYSTEM VALUE"
                    " VALUES (%s, gen_random_uuid(), 't', 'v')",
                    [id],
                )
            conn.rollback()
        conn.execute(
            "INSERT INTO outbox_events (id, event_id, topic, value) OVERRIDING SYSTEM VALUE"
            " VALUES (1, gen_random_uuid(), 't', 'v')"
        )


def test_a_full_local_queue_after_a_batchs_last_row_is_waited_out(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """librdkafka's local queue holds a batch's rows, and is full after the last one (a batch as
    large as queue.buffering.max.messages: a catch-up setting). The rows waited for deliveries to
    drain it; the position's record, produced next, raised BufferError, and the process ended with
    a traceback at every batch."""
    with psycopg.connect(outbox_db.libpq) as conn:
        sent = add_events(conn, [Event(events_topic, {"n": n}, key=f"k{n % 3}") for n in range(250)])
    flags = ("--batch-size", "100", "-X", "queue.buffering.max.messages=100")
    job, _ = relay_job(tmp_path, env, unique("relay"), *flags)

    def done() -> bool:  # or not to be: it ended, or said a traceback (and hung on to its threads)
        return job.process.poll() is not None or "Traceback" in job.output()

    wait_for(lambda: done() or len(published(bootstrap, events_topic, 3)) >= 250, 60, "them")
    assert not done(), job.output()
    assert sorted(e for *_, e in published(bootstrap, events_topic, 3)) == sorted(map(str, sent))
    assert terminate(job) == 0


def test_an_outbox_id_used_again_is_not_taken_for_a_dead_letter(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """Dead letters were known by the outbox row's id alone. Ids start again (TRUNCATE ...
    RESTART IDENTITY; a move by logical replication, which copies no sequence): the new event
    that took a dead letter's id was left out of every read, then deleted by cleanup."""
    with psycopg.connect(outbox_db.libpq) as conn:
        add_event(conn, "no-such-topic", {"n": 0}, key="a")  # id 1: dead-lettered
    job, _ = relay_job(tmp_path, env, unique("relay"), "--on-poison", "dead-letter", "--topic-wait", "0")
    with psycopg.connect(outbox_db.libpq, autocommit=True) as conn:
        wait_for(lambda: conn.execute("SELECT count(*) FROM relay_dead_letters").fetchone() == (1,), 60, "it")
        conn.execute("TRUNCATE outbox_events RESTART IDENTITY")
    with psycopg.connect(outbox_db.libpq) as conn:
        sent = add_events(conn, [Event(events_topic, {"n": n}, key="a") for n in range(1, 4)])  # ids 1..3
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) >= 3, 60, "the three events")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(i) for i in sent]
    assert terminate(job) == 0


def test_a_primary_that_turned_read_only_is_waited_for_not_a_crash(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """A write freeze (default_transaction_read_only=on: a cutover, a provider's disk-full guard)
    failed the relay's cleanup and base record with an error it did not retry: the process exited
    with a traceback, at each restart, until writes came back."""
    database = outbox_db.libpq
    with psycopg.connect(database, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        with psycopg.connect(database) as conn:
            conn.execute("SET TRANSACTION READ WRITE")  # an application still allowed to write
            first = add_event(conn, events_topic, {"n": 0}, key="a")
        job, _ = relay_job(tmp_path, env, unique("relay"))
        try:
            wait_for(lambda: "waiting for a writable primary" in job.output(), 30, "the relay to wait")
        except AssertionError:
            raise AssertionError(job.output()) from None
        time.sleep(3)
        assert job.process.poll() is None, job.output()
    finally:
        with psycopg.connect(database, autocommit=True) as admin:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    with psycopg.connect(database) as conn:
        last = add_event(conn, events_topic, {"n": 1}, key="a")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) >= 2, 60, "both events")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(first), str(last)]
    assert "Traceback" not in job.output(), job.output()
    assert terminate(job) == 0


@pytest.mark.parametrize("policy", ["dead-letter", "halt"])
def test_a_record_over_the_topics_limit_is_the_only_one_refused_and_at_once(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, policy: str
) -> None:
    """The broker refuses the whole batch that holds a record over the topic's max.message.bytes:
    the rows batched with it must not be dead-lettered in its place, nor wait behind it."""
    topic = create_topic(bootstrap, unique("small"), config={"max.message.bytes": "2000"})
    with psycopg.connect(outbox_db.libpq) as conn:
        ids = add_events(
            conn,
            [
                Event(topic, {"n": 1}, key="a"),
                Event(topic, {"n": 2}, key="a"),
                Event(topic, b"x" * 10_000, key="a"),  # under the client's 1 MB, over the topic's 2 kB
                Event(topic, {"n": 4}, key="a"),
            ],
        )
    job, _ = relay_job(tmp_path, env, unique("relay"), "--on-poison", policy)
    job.wait_for_output(ACTIVE, 60)
    started = time.monotonic()
    events = [str(i) for i in ids]
    expected = events[:2] + events[3:] if policy == "dead-letter" else events[:2]
    wait_for(lambda: [e for *_, e in published(bootstrap, topic, 1)] == expected, 30, f"{expected}")
    took = time.monotonic() - started
    with psycopg.connect(outbox_db.libpq) as conn:
        dead = conn.execute("SELECT event_id::text FROM relay_dead_letters").fetchall()
    assert dead == ([(events[2],)] if policy == "dead-letter" else [])
    if policy == "halt":
        job.wait_for_output("halted on a poison row", 30)
        # The record's size: its value, key and headers
        halted = [line for line in job.output().splitlines() if "halted on a poison row" in line]
        sizes = re.findall(r"record of (\d+) bytes is larger than Kafka accepts", "\n".join(halted))
        assert sizes and all(10_000 < int(size) < 10_100 for size in sizes), sizes  # value, key, headers
    assert terminate(job) == 0
    print(f"the rows around the refused record went out {took:.1f} s after the relay became active")


def test_a_backlog_of_large_rows_goes_out_in_batches_of_bounded_memory(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str
) -> None:
    """After an outage the outbox holds large rows: 5,000 of them (a batch) can be gigabytes,
    which a relay in a container cannot hold: killed, started again on the same batch, killed
    again. A batch ends at --batch-bytes of keys and values (32 MiB), so memory stays bounded."""
    topic = create_topic(bootstrap, unique("large"), partitions=1)
    size, count = 800_000, 400  # under Kafka's 1 MB a record; 305 MiB in all
    events: list[str] = []
    with psycopg.connect(outbox_db.libpq) as conn:
        for start in range(0, count, 50):
            part = [Event(topic, os.urandom(size), key=f"k{i % 3}") for i in range(start, start + 50)]
            events += [str(i) for i in add_events(conn, part)]
            conn.commit()
    job, _ = relay_job(tmp_path, env, unique("relay"))
    job.wait_for_output(ACTIVE, 60)
    wait_for(lambda: len(published(bootstrap, topic, 1)) >= count, 240, "every large row published")
    peak = peak_memory(job.process.pid)
    assert [e for *_, e in published(bootstrap, topic, 1)] == events
    assert terminate(job) == 0
    said = f"the relay peaked at {peak >> 20} MiB for a backlog of {count * size >> 20} MiB"
    assert peak < 400 * 2**20, said
    print(said)


def peak_memory(pid: int) -> int:
    """A process's peak resident memory so far, in bytes (Linux: VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)[1]) * 1024  # type: ignore[index]


def test_a_role_without_a_privilege_the_relay_needs_stops_it_with_one_line(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """A least-privilege role that may read and publish but not delete published rows: the first
    cleanup is refused. That is no outage to retry, and no crash: one line naming what to grant."""
    role = unique("relay_role")
    with psycopg.connect(outbox_db.libpq, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO "{role}"')
        with admin.transaction():
            add_event(admin, events_topic, {"n": 1}, key="a")
    url = outbox_db.raw.replace("postgres@", f"{role}@", 1)
    job, _ = relay_job(tmp_path, {**env, "DATABASE_URL": url}, unique("relay"))
    assert job.wait(60) == 2, job.output()
    lines = [line for line in job.output().splitlines() if "RELAY_NOT_PERMITTED" in line]
    assert len(lines) == 1 and "permission denied for table outbox_events" in lines[0], job.output()
    assert role in lines[0], job.output()
    assert "Traceback" not in job.output(), job.output()


def test_a_kafka_setting_the_client_does_not_take_stops_the_relay_with_one_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A typo in -X (or a Java-only setting from a Connect worker's file) is no outage: no broker
    will ever take it, so retrying it for minutes with /healthz saying "retrying" misleads."""
    job, _ = relay_job(tmp_path, env, unique("relay"), "-X", "batch.num.messages=many")
    assert job.wait(60) == 2, job.output()
    lines = [line for line in job.output().splitlines() if "RELAY_KAFKA_SETTING_INVALID" in line]
    assert len(lines) == 1 and "batch.num.messages" in lines[0], job.output()
    assert "retrying" not in job.output(), job.output()
    # In JSON logs the reason is a log line too, for pipelines that read nothing else.
    job, _ = relay_job(
        tmp_path, env, unique("relay"), "-X", "batch.num.messages=many", "--log-format", "json"
    )
    assert job.wait(60) == 2, job.output()
    logged = [json.loads(line) for line in job.output().splitlines() if line.startswith("{")]
    assert [r["code"] for r in logged if r.get("level") == "critical"] == ["RELAY_KAFKA_SETTING_INVALID"], (
        logged
    )


def test_a_held_cleanup_holds_back_no_event(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """Deleting published rows is off the publishing loop: a cleanup held at its start, as a slow
    DELETE holds it, must not hold back the events committed meanwhile."""
    first = Writers(outbox_db, events_topic).start(transactions=10)
    first.join()
    job, resume = relay_job(tmp_path, env, unique("relay"), pause_at="before-cleanup")
    job.wait_for_output("paused at before-cleanup", 60)
    second = Writers(outbox_db, events_topic).start(transactions=10)
    second.join()
    committed = Committed.merged(first.committed, second.committed)
    assert_exactly_once(wait_published(bootstrap, events_topic, 3, committed.count, timeout=30), committed)
    assert outbox_rows(outbox_db) == committed.count, "rows deleted by a cleanup that was held"
    resume.touch()
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup once it goes on")
    assert terminate(job) == 0


def test_cleanup_leaves_what_a_slower_relay_of_the_same_outbox_has_not_published(
    tmp_path: Path, outbox_db: DatabaseUrl, bootstrap: str, own_broker: Broker
) -> None:
    """Two relay names on one outbox, each to its own Kafka cluster: the fast one's cleanup must
    not delete rows the slow one has yet to publish; once both have, the rows go."""
    topic = unique("events")
    for cluster in (bootstrap, own_broker.bootstrap):
        create_topic(cluster, topic, partitions=3)
    first = Writers(outbox_db, topic).start(transactions=20)
    first.join()
    slow_env = {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap}
    slow, resume = relay_job(tmp_path, slow_env, unique("slow"), pause_at="before-produce")
    slow.wait_for_output("paused at before-produce", 60)
    fast_env = {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    fast, _ = relay_job(tmp_path, fast_env, unique("fast"))
    second = Writers(outbox_db, topic).start(transactions=20)
    second.join()
    committed = Committed.merged(first.committed, second.committed)
    assert_exactly_once(wait_published(bootstrap, topic, 3, committed.count), committed)
    time.sleep(2.5)  # two rounds of the fast relay's cleanup
    assert outbox_rows(outbox_db) == committed.count, "cleanup deleted rows the slow relay has not published"
    resume.touch()
    assert_exactly_once(wait_published(own_broker.bootstrap, topic, 3, committed.count), committed)
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup once both relays published")
    listed = outbox("relays", "list", env={"DATABASE_URL": outbox_db.raw})
    assert listed.code == 0 and listed.out.count("running") == 2, listed
    assert terminate(fast) == 0 and terminate(slow) == 0
    slow_name = next(line.split("\t")[0] for line in listed.out.splitlines() if line.startswith("slow"))
    assert outbox("relays", "forget", slow_name, env={"DATABASE_URL": outbox_db.raw}).code == 0
    listed = outbox("relays", "list", env={"DATABASE_URL": outbox_db.raw})
    assert [line.split("\t")[2] for line in listed.out.splitlines()] == ["stopped"], listed


def test_a_relay_name_added_beside_a_cleaning_one_publishes_its_whole_first_delta(
    tmp_path: Path, outbox_db: DatabaseUrl, bootstrap: str, own_broker: Broker
) -> None:
    """A relay new to the database recorded itself with its first delta's mark, after reading the
    delta's first batch: until that commit the other relays' cleanup did not know it, and deleted
    rows of the delta it had yet to read. Its cluster never got them, and nothing was said."""
    topic = unique("events")
    for cluster in (bootstrap, own_broker.bootstrap):
        create_topic(cluster, topic)
    with psycopg.connect(outbox_db.libpq) as conn:
        sent = add_events(conn, [Event(topic, {"n": n}, key=str(n % 7)) for n in range(2000)])
    first_env = {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    first = unique("first")
    job, _ = relay_job(tmp_path, first_env, first, "--no-cleanup")
    assert len(wait_published(bootstrap, topic, 1, len(sent))) == len(sent)
    assert terminate(job) == 0
    added = unique("added")
    with psycopg.connect(outbox_db.libpq, autocommit=True) as conn:
        # The added relay's first delta mark takes 8 s to write: time for the first relay's cleanup.
        conn.execute(
            "CREATE FUNCTION slow_mark() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.relay = '{added}' AND NEW.target IS DISTINCT FROM NEW.base THEN"
            " PERFORM pg_sleep(8); END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER slow_mark BEFORE INSERT ON relay_positions"
            " FOR EACH ROW EXECUTE FUNCTION slow_mark()"
        )
        added_env = {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": own_broker.bootstrap}
        other, _ = relay_job(tmp_path, added_env, added, "--batch-size", "500")

        def sleeping() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
            ).fetchone()
            return row == (1,)

        wait_for(sleeping, 60, "the added relay's first mark")
        job, _ = relay_job(tmp_path, first_env, first)  # the first relay again, cleaning
        records = wait_published(own_broker.bootstrap, topic, 1, len(sent), timeout=60)
    assert sorted(e for *_, e in records) == sorted(map(str, sent)), f"{len(records)} of {len(sent)}"
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup once both relays published")
    assert terminate(job) == 0 and terminate(other) == 0


def test_the_positions_topic_is_made_compacted_and_an_uncompacted_one_is_named(
    tmp_path: Path, env: dict[str, str], bootstrap: str
) -> None:
    """Made compacted and never electing an out-of-sync leader, whatever the cluster's default; an
    existing one that does either is named at the start."""
    unclean = {"cleanup.policy": "delete", "unclean.leader.election.enable": "true"}
    made, given = (unique("positions"), create_topic(bootstrap, unique("positions"), config=unclean))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (made, given):
        job, _ = relay_job(tmp_path, env, unique("relay"), "--positions-topic", topic)
        job.wait_for_output(ACTIVE, 60)
        assert terminate(job) == 0
    resource = ConfigResource(ConfigResource.Type.TOPIC, made)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["cleanup.policy"].value == "compact" and config["min.insync.replicas"].value == "1"
    # Kafka never compacts a log's open segment, which by default stays open for 1 GiB or 7 days:
    # millions of position records, each read into memory at every session's start.
    assert (config["segment.bytes"].value, config["segment.ms"].value) == (str(16 * 2**20), "3600000")
    election = config["unclean.leader.election.enable"]
    assert (election.value, election.is_default) == ("false", False)  # the topic's own, not the cluster's
    assert f"the relay positions topic {given!r} is not compacted" in job.output()
    assert f"the relay positions topic {given!r} allows an unclean leader election" in job.output()


def test_an_events_topic_that_allows_an_unclean_election_is_named_once_and_still_published(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """An out-of-sync replica made leader drops records the relay recorded as published: they are
    lost for good. The relay cannot mend the user's topic; it names it once, and publishes."""
    unclean = create_topic(bootstrap, unique("unclean"), config={"unclean.leader.election.enable": "true"})
    job, _ = relay_job(tmp_path, env, unique("relay"))
    sent: list[str] = []
    for n in range(2):  # two batches: the second says nothing again
        with psycopg.connect(outbox_db.libpq) as conn:
            sent += [str(add_event(conn, topic, {"n": n}, key="a")) for topic in (unclean, events_topic)]
        wait_for(lambda n=n: len(published(bootstrap, unclean, 1)) == n + 1, 60, f"batch {n + 1}")
    assert [e for *_, e in published(bootstrap, unclean, 1)] == sent[0::2]
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == sent[1::2]
    warned = [line for line in job.output().splitlines() if "allows an unclean leader election" in line]
    assert len(warned) == 1 and repr(unclean) in warned[0], warned
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


def test_a_restart_while_another_relay_holds_a_transaction_open_resumes_from_its_own_position(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """Every relay writes its position into the positions topic's one partition, inside its batch's
    transaction, so another relay's open transaction stands before positions committed later. A
    relay restarted then must wait for its own (before, it read only up to that open transaction,
    resumed from an older position and published its events again)."""
    positions = unique("positions")
    flags = ("--positions-topic", positions, "--no-cleanup")  # rows stay: a resume too early shows
    name = unique("relay")
    writers = Writers(outbox_db, events_topic).start(transactions=10)
    writers.join()
    job, _ = relay_job(tmp_path, env, name, *flags, label="first")
    wait_published(bootstrap, events_topic, 3, writers.committed.count)

    other = transactional_producer(bootstrap)  # another relay's batch, mid-way
    other.begin_transaction()
    other.produce(positions, key=b"another relay", value=b"{}")
    other.flush(30)

    more = Writers(outbox_db, events_topic).start(transactions=10)
    more.join()
    committed = Committed.merged(writers.committed, more.committed)
    wait_published(bootstrap, events_topic, 3, committed.count)  # its position lies beyond the open one
    job.kill9()

    again, _ = relay_job(tmp_path, env, name, *flags, label="again")
    time.sleep(3)  # reading its positions, held by the open transaction
    other.abort_transaction(30)
    again.wait_for_output(ACTIVE, 60)
    last = Writers(outbox_db, events_topic).start(transactions=5)
    last.join()
    committed = Committed.merged(committed, last.committed)
    wait_published(bootstrap, events_topic, 3, committed.count)
    time.sleep(2)  # a batch published twice lands by now
    assert_exactly_once(published(bootstrap, events_topic, 3), committed)
    said = again.output()
    assert "outbox again" not in said and "Publishing again" not in said, said
    assert terminate(again) == 0, again.output()
