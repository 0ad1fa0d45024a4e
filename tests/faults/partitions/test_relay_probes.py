"""The relay's probes on real faults: /livez stays 200 through a Kafka cut, a PostgreSQL cut and a
poison halt, each of which /readyz shows; a loop held mid-batch fails both, until it goes on."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from outbox.relay.pause import BEFORE_COMMIT
from outbox.writer import add_event
from tests.faults.partitions.links import KAFKA_TIMEOUT, Proxied, proxied_relay
from tests.helpers import Job, create_topic, unique, wait_for
from tests.relay_support import published, relay_job, terminate

# The relay's bound on a quiet session (RelaySettings.silence: D + 5K + P) under links.FAST.
FAST_BOUND = 3 + 5 * KAFKA_TIMEOUT + 0.2


def probe(job: Job, path: str) -> tuple[int, str]:
    served = re.search(r"/readyz url=(\S+)", job.output())
    if not served:  # not serving yet
        assert job.process.poll() is None, job.output()
        return 0, ""
    try:
        with urllib.request.urlopen(served[1] + path, timeout=10) as answer:
            return answer.status, answer.read().decode().strip()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode().strip()


def alive_while_not_ready(job: Job, bound: float, state: str | tuple[str, ...]) -> None:
    """/livez 200 at every look for longer than the bound, /readyz 503 with `state` all along."""
    wait_for(lambda: probe(job, "/readyz")[1].startswith(state), 90, f"/readyz saying {state}")
    until = time.monotonic() + bound + 5
    while time.monotonic() < until:
        assert probe(job, "/livez") == (200, "alive"), job.output()[-3000:]
        code, said = probe(job, "/readyz")
        assert code == 503 and said.startswith(state), (code, said)
        time.sleep(0.5)


@pytest.mark.parametrize("cut", ["kafka", "postgres"])
def test_an_outage_shows_in_readyz_and_never_fails_livez(
    tmp_path: Path, db: Proxied, kafka: Proxied, cut: str
) -> None:
    topic = create_topic(kafka.direct, unique("probes"))
    job, _ = proxied_relay(tmp_path, db, kafka, unique("relay"))
    wait_for(lambda: probe(job, "/readyz") == (200, "active"), 90, "the relay active")
    assert probe(job, "/livez") == (200, "alive")
    (kafka if cut == "kafka" else db).cut()
    with psycopg.connect(db.direct) as conn:  # a row to publish: an idle relay asks Kafka nothing
        add_event(conn, topic, {"n": 1}, key="a")
    alive_while_not_ready(job, FAST_BOUND, ("retrying", "waiting for"))
    kafka.heal()
    db.heal()
    wait_for(lambda: probe(job, "/readyz") == (200, "active"), 120, "the relay active again")
    wait_for(lambda: len(published(kafka.direct, topic, 1)) == 1, 60, "the event published")
    assert terminate(job) == 0


def test_a_poison_halt_shows_in_readyz_and_never_fails_livez(
    tmp_path: Path, db: Proxied, kafka: Proxied
) -> None:
    with psycopg.connect(db.direct) as conn:
        add_event(conn, unique("missing"), {"n": 1}, key="a")  # no such topic: a halt
    flags = ("--kafka-timeout", "2", "--database-timeout", "2")
    env = {"DATABASE_URL": db.direct, "KAFKA_BOOTSTRAP_SERVERS": kafka.direct}
    job, _ = relay_job(tmp_path, env, unique("relay"), *flags)
    alive_while_not_ready(job, 2 + 5 * 2 + 0.2, "halted")
    assert terminate(job) == 0


def test_a_loop_held_mid_batch_fails_livez_and_readyz_until_it_goes_on(
    tmp_path: Path, db: Proxied, kafka: Proxied
) -> None:
    """The loop stops turning (held before its commit, as a wedged call would hold it): past the
    bound, /livez and /readyz say it is wedged; let go, it publishes and both are 200 again."""
    topic = create_topic(kafka.direct, unique("probes"))
    with psycopg.connect(db.direct) as conn:
        add_event(conn, topic, {"n": 1}, key="a")
    flags = ("--kafka-timeout", "2", "--database-timeout", "2")
    env = {"DATABASE_URL": db.direct, "KAFKA_BOOTSTRAP_SERVERS": kafka.direct}
    job, resume = relay_job(tmp_path, env, unique("relay"), *flags, pause_at=BEFORE_COMMIT)
    job.wait_for_output(f"paused at {BEFORE_COMMIT}", 60)
    wait_for(lambda: probe(job, "/livez")[0] == 503, 120, "/livez failing")
    code, said = probe(job, "/livez")
    assert said.startswith("wedged: the loop has not turned for ") and "last: " in said, said
    assert probe(job, "/readyz") == (code, said)
    resume.touch()
    wait_for(lambda: len(published(kafka.direct, topic, 1)) == 1, 120, "the event published")
    wait_for(lambda: probe(job, "/livez") == (200, "alive"), 60, "/livez 200 again")
    assert terminate(job) == 0
