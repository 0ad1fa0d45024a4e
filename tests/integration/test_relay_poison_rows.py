"""Rows Kafka will not take halt the relay or become dead letters, and hold back no other row."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_event, add_events
from tests.helpers import create_topic, unique, wait_for
from tests.relay_support import ACTIVE, SHORT_HALT, published, relay_job, terminate


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
    job, _ = relay_job(
        tmp_path, env, unique("relay"), "--on-poison", "dead-letter", "--topic-wait", "120", *SHORT_HALT
    )
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
