"""The relay publishes each committed event once, in order per key, through standbys, shards and restarts."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psycopg
import pytest

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox.relay.outbox_table import OutboxTable, opened
from outbox.relay.position import Position, Shard
from outbox.writer import Event, add_event, add_events
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
    # Without cleanup: a name counts for the others' cleanup once it starts, which for the other
    # name is after the hold, and the held one's cleanup could delete the rows before that.
    held, resume = relay_job(
        tmp_path,
        env,
        unique("held"),
        *("--positions-topic", positions, "--no-cleanup"),
        pause_at="before-commit",
        label="held",
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
