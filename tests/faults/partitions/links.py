"""Network partitions: links cut through Toxiproxy on loopback, held, and healed; what the cases share.

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

import time
from dataclasses import dataclass
from pathlib import Path

from outbox.core.config import DatabaseUrl
from outbox_dev.toxiproxy import Link, Stream
from tests.helpers import (
    Job,
    create_topic,
    measured,
    unique,
)
from tests.relay_support import (
    Committed,
    Writers,
    relay_job,
)

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


def server_url_port(url: DatabaseUrl) -> int:
    return int(url.raw.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


def proxied_relay(
    tmp: Path, db: Proxied, kafka: Proxied, name: str, *flags: str, pause_at: str = "none"
) -> tuple[Job, Path]:
    env = {"DATABASE_URL": db.proxied, "KAFKA_BOOTSTRAP_SERVERS": kafka.proxied}
    return relay_job(tmp, env, name, *FAST, *flags, pause_at=pause_at)


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
