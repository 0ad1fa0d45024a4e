"""Network partitions (issue 27): links cut through Toxiproxy on loopback, held, and healed.

A kill -9 closes sockets and the peer hears of it at once; a partition leaves
them open, and a request's answer simply never comes. Every process under test
reaches Kafka through a listener the broker advertises at the proxy's port (so
metadata leads it back into the proxy, never around it) and PostgreSQL through
a proxy too. Writers and the checking readers go around the proxy. Each case
checks every record with two readers, ours and Kafka's console consumer (both
read_committed), and with `outbox verify`; and prints the time from the heal
to the moment the process under test said it had resumed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.config import DatabaseUrl
from core.errors import ServiceUnavailable
from outbox.dev.kafka import Broker, Cluster
from outbox.dev.toxiproxy import Link, Stream, Toxiproxy
from outbox.relay.pause import BEFORE_CLEANUP, BEFORE_COMMIT, MID_TRANSACTION
from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import read_range
from tests.helpers import (
    Job,
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

PARTITIONS = 3
STALL, BACK, STANDBY = "session ended, retrying", "resumed after retrying", "standing by"
# Calls wait 3 s for an answer; an open transaction is aborted by Kafka after 8 s.
KAFKA_TIMEOUT, TRANSACTION_TIMEOUT = 3, 8
FAST = (
    *("--kafka-timeout", str(KAFKA_TIMEOUT), "--database-timeout", "3", "--batch-size", "20"),
    *("-X", f"request.timeout.ms={KAFKA_TIMEOUT * 1000}"),
    *("-X", f"transaction.timeout.ms={TRANSACTION_TIMEOUT * 1000}"),
)


@dataclass(frozen=True)
class Proxied:
    """A service reached two ways: `direct` (writers, checking readers) and `proxied`, through links."""

    direct: str
    proxied: str
    links: tuple[Link, ...]

    def cut(self, stream: Stream = "both") -> None:
        for link in self.links:
            link.cut(stream)

    def heal(self) -> None:
        for link in self.links:
            link.heal()


@pytest.fixture(scope="module")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    proxy = Toxiproxy(tmp_path_factory.mktemp("toxiproxy"))
    yield proxy
    proxy.close()


@pytest.fixture(scope="module", params=["broker"])
def kafka(
    request: pytest.FixtureRequest, toxiproxy: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxied]:
    """One broker, or (parametrized "cluster") three, each node behind a link of its own."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "cluster":
        cluster = Cluster(root, size=3, proxied=True)
        direct, listeners, close = cluster.bootstrap, cluster.proxied, cluster.close
    else:
        broker = Broker(root, proxied=True)
        direct, listeners, close = broker.bootstrap, {1: broker.proxied}, broker.stop
    links = tuple(
        toxiproxy.link(f"kafka-{request.param}-{node}", f"127.0.0.1:{listener.port}", listener.advertised)
        for node, listener in listeners.items()
        if listener is not None
    )
    yield Proxied(direct, ",".join(f"127.0.0.1:{p.advertised}" for p in listeners.values() if p), links)
    for link in links:
        link.close()
    close()


@pytest.fixture(scope="module")
def postgres_link(toxiproxy: Toxiproxy, server_url: DatabaseUrl) -> Link:
    return toxiproxy.link("postgres", f"127.0.0.1:{server_url_port(server_url)}")


def server_url_port(url: DatabaseUrl) -> int:
    return int(url.raw.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


@pytest.fixture
def db(outbox_db: DatabaseUrl, postgres_link: Link, kafka: Proxied) -> Iterator[Proxied]:
    """The test's outbox database, direct and through the proxy; every link healed after the test."""
    port = server_url_port(outbox_db)
    through = outbox_db.raw.replace(f":{port}/", f":{postgres_link.port}/", 1)
    yield Proxied(outbox_db.raw, through, (postgres_link,))
    postgres_link.heal()
    kafka.heal()


def proxied_relay(
    tmp: Path, db: Proxied, kafka: Proxied, name: str, pause_at: str = "none"
) -> tuple[Job, Path]:
    env = {"DATABASE_URL": db.proxied, "KAFKA_BOOTSTRAP_SERVERS": kafka.proxied}
    return relay_job(tmp, env, name, *FAST, pause_at=pause_at)


def healed(services: list[Proxied], job: Job, what: str, back: str = BACK, timeout: float = 90) -> None:
    """Heal the links; wait until the job says `back` once more than before; print how long it took."""
    before = job.output().count(back)
    for service in services:
        service.heal()
    at = time.monotonic()
    deadline = at + timeout
    while job.output().count(back) <= before:
        assert job.process.poll() is None, job.output()
        assert time.monotonic() < deadline, f"no {back!r} {timeout}s after the heal:\n{job.output()[-4000:]}"
        time.sleep(0.05)
    measured(f"heal to resume: {what}", time.monotonic() - at)


def cut_at(
    tmp: Path, db: Proxied, kafka: Proxied, point: str, cut: Proxied, stream: Stream = "both"
) -> tuple[DatabaseUrl, str, Committed, Job]:
    """A new topic with 20 transactions committed for it; a relay through the proxies held at
    `point` of its first batch, the links to `cut` cut there, then let go on; 20 transactions
    more, committed while it is cut off. Returns once the relay said it lost a session."""
    url = DatabaseUrl.parse(db.direct)
    topic = create_topic(kafka.direct, unique("cut"), partitions=PARTITIONS)
    first = Writers(url, topic).start(transactions=20)
    first.join()
    job, resume = proxied_relay(tmp, db, kafka, unique("relay"), pause_at=point)
    job.wait_for_output(f"paused at {point}", 60)
    cut.cut(stream)
    resume.touch()
    second = Writers(url, topic).start(transactions=20)
    second.join()
    job.wait_for_output(STALL, 60)
    return url, topic, Committed.merged(first.committed, second.committed), job


def kafka_name(kafka: Proxied) -> str:
    return "three brokers" if len(kafka.links) > 1 else "one broker"


def one_line_an_outage(job: Job, *names: str) -> None:
    """Each outage said once at WARNING, naming what could not be reached; and once that it is over."""
    lines = [line for line in job.output().splitlines() if STALL in line]
    assert len(lines) == job.output().count(BACK) >= 1, job.output()[-4000:]
    assert all(any(name in line for name in names) for line in lines), lines


# -- a: relay <-> Kafka ------------------------------------------------------------------------


LATE = TRANSACTION_TIMEOUT + 4


@pytest.mark.parametrize(
    ("kafka", "point", "stream", "held"),
    [
        ("broker", MID_TRANSACTION, "both", 2),
        ("broker", MID_TRANSACTION, "both", LATE),
        ("broker", BEFORE_COMMIT, "downstream", 2),
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
    [("broker", "postgres"), ("broker", "postgres-and-kafka"), ("cluster", "postgres-and-kafka")],
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
        ):
            list(read)
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
