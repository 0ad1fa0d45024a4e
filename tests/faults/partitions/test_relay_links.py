"""The relay and kafka_rc's readers cut from Kafka and PostgreSQL, held, and healed; a zombie relay."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ServiceUnavailable
from outbox.relay.pause import BEFORE_CLEANUP, BEFORE_COMMIT, MID_TRANSACTION
from outbox.writer import Event, add_events
from outbox_dev.toxiproxy import Stream
from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import read_range
from tests.faults.partitions.links import (
    FAST,
    PARTITIONS,
    STANDBY,
    TRANSACTION_TIMEOUT,
    Proxied,
    cut_at,
    healed,
    kafka_name,
    one_line_an_outage,
    proxied_relay,
)
from tests.helpers import (
    create_topic,
    measured,
    produce_transaction,
    transactional_producer,
    unique,
    wait_for,
)
from tests.relay_support import (
    ACTIVE,
    Committed,
    Writers,
    check_two_readers,
    published,
    relay_job,
    terminate,
)
from tests.source_support import records

# -- a: relay <-> Kafka ------------------------------------------------------------------------


LATE = TRANSACTION_TIMEOUT + 4


@pytest.mark.parametrize(
    ("kafka", "point", "stream", "held"),
    [  # healed early: under `make soak`, as the late heals cover the same paths and more
        pytest.param("broker", MID_TRANSACTION, "both", 2, marks=pytest.mark.soak),
        ("broker", MID_TRANSACTION, "both", LATE),
        pytest.param("broker", BEFORE_COMMIT, "downstream", 2, marks=pytest.mark.soak),
        ("broker", BEFORE_COMMIT, "downstream", LATE),
        ("cluster", BEFORE_COMMIT, "downstream", LATE),
    ],
    ids=[
        "black-hole-mid-transaction-healed-early",
        "black-hole-mid-transaction-healed-late",
        "answers-lost-in-commit-healed-early",
        "answers-lost-in-commit-healed-late",
        "three-brokers-answers-lost-in-commit-healed-late",
    ],
    indirect=["kafka"],
)
def test_the_relay_cut_from_kafka_in_a_transaction(
    tmp_path: Path, db: Proxied, kafka: Proxied, point: str, stream: Stream, held: float
) -> None:
    """Black-holed mid-transaction, or its commit's answer lost (sent, done or not, never told);
    healed before Kafka aborts the open transaction on its timeout, and after."""
    url, topic, committed, job = cut_at(tmp_path, db, kafka, point, kafka, stream)
    time.sleep(held)
    healed([kafka], job, f"relay, Kafka ({kafka_name(kafka)}) {stream} cut at {point}, held {held}s")
    check_two_readers(kafka.direct, topic, PARTITIONS, committed, url)
    assert terminate(job) == 0
    one_line_an_outage(job, f"Kafka at {kafka.proxied}")


def test_a_link_too_slow_for_a_whole_batch_in_one_transaction(
    tmp_path: Path, db: Proxied, kafka: Proxied
) -> None:
    """A link that carries a batch in more than transaction.timeout.ms (a slow or throttled link, a
    producer quota): Kafka aborts each such transaction, and the same batch sent again never fits.
    The relay takes smaller batches until one fits, and publishes every row once."""
    url = DatabaseUrl.parse(db.direct)
    topic = create_topic(kafka.direct, unique("slow"), partitions=PARTITIONS)
    writers = Writers(url, topic).start(transactions=80)  # some 640 rows: a first batch of 500
    writers.join()
    for link in kafka.links:  # 8 kB/s toward Kafka: 500 rows take some 11 s, past its 8 s
        link.add("bandwidth", "upstream", rate=8)
    job, _ = proxied_relay(tmp_path, db, kafka, unique("relay"), "--batch-size", "500")
    job.wait_for_output(ACTIVE, 60)
    try:
        check_two_readers(kafka.direct, topic, PARTITIONS, writers.committed, url, timeout=150)
    finally:
        kafka.heal()
    assert terminate(job) == 0
    assert "smaller batches" in job.output(), job.output()[-4000:]


def test_a_link_too_slow_for_a_batch_of_large_rows_cut_by_its_bytes(
    tmp_path: Path, db: Proxied, kafka: Proxied
) -> None:
    """Large rows: the byte budget (--batch-bytes) cuts each batch well below half of --batch-size.
    Only a batch of over half the limit made the next ones smaller, so such a batch, too slow for
    the link, was read and cut the same way again and failed for ever."""
    url = DatabaseUrl.parse(db.direct)
    topic = create_topic(kafka.direct, unique("slow"), partitions=PARTITIONS)
    events = [Event(topic, {"n": i, "pad": "x" * 2000}, key=f"k{i % 5}") for i in range(60)]
    with psycopg.connect(url.libpq) as conn:
        add_events(conn, events)
    committed = Committed()
    for e in events:
        committed.add(str(e.key), [str(e.event_id)])
    for link in kafka.links:  # 8 kB/s toward Kafka: a batch of 50 such rows takes some 13 s, past 8 s
        link.add("bandwidth", "upstream", rate=8)
    flags = ("--batch-size", "500", "--batch-bytes", "100000")  # some 50 rows a batch, of 500
    job, _ = proxied_relay(tmp_path, db, kafka, unique("relay"), *flags)
    job.wait_for_output(ACTIVE, 60)
    try:
        check_two_readers(kafka.direct, topic, PARTITIONS, committed, url, timeout=150)
    finally:
        kafka.heal()
    assert terminate(job) == 0
    assert "smaller batches" in job.output(), job.output()[-4000:]


# -- b: relay <-> PostgreSQL -------------------------------------------------------------------


@pytest.mark.parametrize("point", [MID_TRANSACTION, BEFORE_CLEANUP])
def test_the_relay_cut_from_postgres_mid_batch_and_in_cleanup(
    tmp_path: Path, db: Proxied, kafka: Proxied, point: str
) -> None:
    """The batch's rows are read, then PostgreSQL stops answering: the relay must not hang in a
    read that never returns, and must not publish the batch twice once it is back."""
    url, topic, committed, job = cut_at(tmp_path, db, kafka, point, db)
    time.sleep(2)
    healed([db], job, f"relay, PostgreSQL black-holed at {point}")
    check_two_readers(kafka.direct, topic, PARTITIONS, committed, url)
    assert terminate(job) == 0
    one_line_an_outage(job, "PostgreSQL at")


# -- c: the zombie relay -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kafka", "cut"),
    [  # both links cut, on one broker: under `make soak`, as on three brokers it runs in `make test`
        ("broker", "postgres"),
        pytest.param("broker", "postgres-and-kafka", marks=pytest.mark.soak),
        ("cluster", "postgres-and-kafka"),
    ],
    indirect=["kafka"],
)
def test_a_zombie_relay_is_fenced_when_its_links_heal(
    tmp_path: Path, db: Proxied, kafka: Proxied, cut: str
) -> None:
    """The active relay is cut off mid-transaction; its standby (direct links) takes over and
    publishes; then the old one is healed. It must publish nothing more."""
    url, name = DatabaseUrl.parse(db.direct), unique("relay")
    topic = create_topic(kafka.direct, unique("c"), partitions=PARTITIONS)
    first = Writers(url, topic).start(transactions=20)
    first.join()
    zombie, resume = proxied_relay(tmp_path, db, kafka, name, pause_at=MID_TRANSACTION)
    zombie.wait_for_output(f"paused at {MID_TRANSACTION}", 60)
    env = {"DATABASE_URL": db.direct, "KAFKA_BOOTSTRAP_SERVERS": kafka.direct}
    standby, _ = relay_job(tmp_path, env, name, *FAST)
    standby.wait_for_output(STANDBY, 60)
    links = [db, kafka] if cut == "postgres-and-kafka" else [db]
    for service in links:
        service.cut()
    cut_at = time.monotonic()
    resume.touch()
    second = Writers(url, topic).start(transactions=20)
    second.join()
    standby.wait_for_output(ACTIVE, 120)
    measured(
        f"zombie: the standby active after the cut ({cut}, {kafka_name(kafka)})", time.monotonic() - cut_at
    )
    wait_records = Committed.merged(first.committed, second.committed)
    check_two_readers(kafka.direct, topic, PARTITIONS, wait_records, url)
    healed(links, zombie, f"zombie healed ({cut}, {kafka_name(kafka)}), back as a standby", back=STANDBY)
    third = Writers(url, topic).start(transactions=20)
    third.join()
    committed = Committed.merged(first.committed, second.committed, third.committed)
    records = check_two_readers(kafka.direct, topic, PARTITIONS, committed, url)
    assert len(records) == committed.count
    assert zombie.output().count(ACTIVE) == 1, zombie.output()[-4000:]
    time.sleep(2)  # anything a zombie still had in flight would land now
    assert sorted(published(kafka.direct, topic, PARTITIONS)) == sorted(records)
    assert terminate(zombie) == 0
    assert terminate(standby) == 0


# -- d: kafka_rc's readers ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream-waits", "batch-fails"])
def test_a_kafka_rc_reader_cut_from_its_partitions_leader(
    kafka: Proxied, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A task reading a range whose leader it cannot reach: in a stream it says so once, waits
    (as its driver does) and reads every committed record once the link heals; in a batch query
    it fails at pollTimeoutMs with one line."""
    topic = create_topic(kafka.direct, unique("d"), partitions=1)
    producer = transactional_producer(kafka.direct)
    produce_transaction(producer, topic, records(30, "c"))  # offsets 0-29, marker 30
    produce_transaction(producer, topic, records(5, "a"), commit=False)  # 31-35, marker 36
    produce_transaction(producer, topic, records(10, "c2"))  # 37-46, marker 47
    config = {
        "bootstrap.servers": kafka.proxied,
        "group.id": unique("g"),
        "isolation.level": "read_committed",
    }
    kafka.cut()
    try:
        read_while_cut(kafka, config, topic, stream, caplog)
    finally:
        kafka.heal()  # a test that leaves a link cut would cut the next one off too


def read_while_cut(
    kafka: Proxied, config: dict[str, object], topic: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    read = read_range(
        config,
        Range(topic, 0, 0, 48),
        poll_timeout_s=2,
        fail_on_data_loss=True,
        patience_s=None if stream else 2,
    )
    if not stream:
        with pytest.raises(
            ServiceUnavailable, match=rf"{topic}-0: no progress at offset 0 .*\(option pollTimeoutMs\)"
        ) as caught:
            list(read)
        assert caught.value.code == "KAFKA_RC_READ_STALLED"
        return
    got: list[int] = []
    reader = threading.Thread(
        target=lambda: got.extend(o for b in read for o in b.column("offset").to_pylist())
    )
    with caplog.at_level(logging.WARNING, logger="sinks.kafka_source"):
        reader.start()
        wait_for(lambda: "waiting for it" in caplog.text, 30, "the reader's line that it waits")
        time.sleep(3)
        assert reader.is_alive()
        at = time.monotonic()
        kafka.heal()
        reader.join(60)
        measured("heal to resume: a kafka_rc reader cut from its leader", time.monotonic() - at)
    assert not reader.is_alive()
    assert got == [*range(30), *range(37, 47)]
    # One line a stall, and one when it ends (a second stall after the heal is said the same way).
    assert caplog.text.count("waiting for it") == caplog.text.count("reading again") >= 1, caplog.text
