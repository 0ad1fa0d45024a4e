"""Cleanup deletes published rows off the publishing loop, never one another relay has yet to publish."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_events
from outbox_dev.kafka import Broker
from tests.cli import outbox
from tests.helpers import create_topic, unique, wait_for
from tests.relay_support import (
    Committed,
    Writers,
    assert_exactly_once,
    outbox_rows,
    relay_job,
    terminate,
    wait_published,
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
