"""Storms: the relay killed and paused over and over, for a minute (ten under `make soak`), while
consumer groups of both protocols come and go; every event once in every view."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Broker
from tests.helpers import Job, create_topic, unique, wait_for
from tests.relay_support import ACTIVE, Writers, assert_exactly_once, check_two_readers, relay_job, terminate

# Short timeouts, so a paused active relay's session ends, and its standby takes over, within seconds.
FLAGS = ("--batch-size", "50", "--database-timeout", "2", "--kafka-timeout", "2")
LATE, LATE_S = "late-commit", 5  # the broker frozen 5 s as a commit is sent: 2 s past the call's timeout


class Thaw(threading.Thread):
    """Resumes the broker a relay froze (tests/jobs/relay_job.py, late-commit) where that relay was
    killed or frozen itself before its own timer did: the broker never stays stopped past LATE_S."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.done = pid, threading.Event()
        self.start()

    def run(self) -> None:
        stopped_since: float | None = None
        while not self.done.wait(0.25):
            if not stopped(self.pid):
                stopped_since = None
            elif stopped_since is None:
                stopped_since = time.monotonic()
            elif time.monotonic() - stopped_since > LATE_S + 1:
                os.kill(self.pid, signal.SIGCONT)
                stopped_since = None

    def close(self) -> None:
        self.done.set()
        if self.is_alive():
            self.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def view(seen: list[tuple[int, int, str, str, bool]]) -> list[tuple[int, int, str, str]]:
    """A group's records, each event once where it came again only after a refused commit: a
    repeat after a commit that was taken is kept, for the check to find."""
    refused = {e for *_, e, taken in seen if not taken}
    first: dict[str, tuple[int, int, str, str]] = {}
    repeats: list[tuple[int, int, str, str]] = []
    for p, o, k, e, _ in sorted(seen):
        if e in first and e not in refused:
            repeats.append((p, o, k, e))
        first.setdefault(e, (p, o, k, e))
    return sorted([*first.values(), *repeats])


def event(message: Message) -> str:
    return str(dict(message.headers() or [])["event_id"].decode())


class Group(threading.Thread):
    """A consumer group whose members join, read read_committed a few seconds, commit what they read
    after they count it, and leave; two members at a time, so the group rebalances all along. A
    record whose commit was refused (its partition moved on) is read again by its next owner: its
    repeat is the group's, not the relay's, and is told apart (`view`)."""

    def __init__(self, bootstrap: str, topic: str, protocol: str) -> None:
        super().__init__(daemon=True)
        self.settings = {
            "bootstrap.servers": bootstrap,
            "group.id": unique(f"storm-{protocol}"),
            "group.protocol": protocol,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        self.topic, self.protocol = topic, protocol
        self.seen: list[tuple[int, int, str, str, bool]] = []  # ..., whether its commit was taken
        self.lock = threading.Lock()
        self.stop, self.draining = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        members = [threading.Thread(target=self._member, args=(i,), daemon=True) for i in range(2)]
        for m in members:
            m.start()
        for m in members:
            m.join()

    def _member(self, index: int) -> None:
        rng = random.Random(index)
        try:
            while not self.stop.is_set():
                consumer = Consumer(self.settings)
                consumer.subscribe([self.topic])
                until = time.monotonic() + rng.uniform(1, 4)
                while not self.stop.is_set() and (self.draining.is_set() or time.monotonic() < until):
                    got = [m for m in consumer.consume(500, 0.2) if m.error() is None]
                    if not got:
                        continue
                    ends = {m.partition(): m.offset() + 1 for m in got}
                    asked = [TopicPartition(self.topic, p, o) for p, o in ends.items()]
                    try:
                        answered = consumer.commit(offsets=asked, asynchronous=False) or []
                        taken = {tp.partition for tp in answered if tp.error is None}
                    except KafkaException:
                        taken = set()  # its partitions moved on: the members that have them read them again
                    with self.lock:
                        self.seen += [
                            (m.partition(), m.offset(), m.key().decode(), event(m), m.partition() in taken)
                            for m in got
                        ]
                consumer.close()  # leaves the group: a rebalance
        except BaseException as exc:  # surfaced by the test
            self.errors.append(exc)


@pytest.mark.parametrize(
    "storm_s",
    [
        pytest.param(60, marks=pytest.mark.timeout(600)),
        pytest.param(600, marks=[pytest.mark.soak, pytest.mark.timeout(1500)]),
    ],
)
def test_a_flapping_relay_publishes_each_event_once_to_every_view(
    tmp_path: Path, outbox_db: DatabaseUrl, own_broker: Broker, storm_s: int
) -> None:
    """Two instances of one relay, one or the other killed -9 (and replaced) or frozen with SIGSTOP
    for up to 15 s, or the active one's next commit answered late (its broker frozen past the
    request timeout as the commit is sent), every 1-4 s, while writers commit. Checked by our
    reader, Kafka's console consumer and `outbox verify`, and by each group's view. Seen to catch a
    relay that reads its position read_uncommitted (an event lost), and one that skips fencing (a
    transactional id of each process's own: events twice)."""
    bootstrap, broker = own_broker.bootstrap, own_broker.service.pid
    events_topic = create_topic(bootstrap, unique("events"), partitions=3)
    env = {
        "DATABASE_URL": outbox_db.raw,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "FREEZE_PID": str(broker),
        "FREEZE_S": str(LATE_S),
        "FREEZE_FILE": str(tmp_path / "freeze"),
    }
    name, rng = unique("relay"), random.Random()
    writers = Writers(outbox_db, events_topic).start(max_delay=0.05)
    groups = [Group(bootstrap, events_topic, protocol) for protocol in ("classic", "consumer")]
    for group in groups:
        group.start()
    started: list[Job] = []

    def relay() -> Job:
        started.append(relay_job(tmp_path, env, name, *FLAGS, pause_at=LATE, label=unique("relay"))[0])
        return started[-1]

    relays, thaw = [relay(), relay()], Thaw(broker)
    kills = pauses = 0
    faults = itertools.cycle(("kill", "pause", "late", "kill", "pause"))
    deadline = time.monotonic() + storm_s
    try:
        wait_for(lambda: any(ACTIVE in j.output() for j in relays), 60, "an active relay")
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1, 4))
            victim, fault = rng.randrange(len(relays)), next(faults)
            if fault == "late":  # the next commit's answer late: the broker frozen as it is sent
                Path(env["FREEZE_FILE"]).touch()
            elif fault == "kill":  # kill -9, and a new instance in its place
                relays[victim].kill9()
                relays[victim] = relay()
                kills += 1
            else:  # frozen past its session's silence: the standby takes over; it wakes a zombie
                os.killpg(relays[victim].process.pid, signal.SIGSTOP)
                time.sleep(rng.uniform(2, 15))
                os.killpg(relays[victim].process.pid, signal.SIGCONT)
                pauses += 1
        writers.stop.set()
        writers.join()
        thaw.close()
        late = sum(j.output().count("late commit:") for j in started)
        print(f"storm: {kills} kill -9s, {pauses} pauses, {late} late commits of the relay in {storm_s} s")
        records = check_two_readers(bootstrap, events_topic, 3, writers.committed, outbox_db)
        assert writers.committed.count > 200 and kills + pauses + late >= storm_s / 10 and late > 0
        for group in groups:
            group.draining.set()
        deadline = time.monotonic() + max(120, storm_s)
        while time.monotonic() < deadline and any(len({r[3] for r in g.seen}) < len(records) for g in groups):
            time.sleep(0.5)
    finally:
        thaw.close()
        writers.stop.set()
        for group in groups:
            group.stop.set()
            group.join(60)
    for group in groups:
        assert not group.errors, group.errors
        assert_exactly_once(view(group.seen), writers.committed)  # the group's view, whoever read it
    for job in relays:
        assert terminate(job) == 0, job.output()[-3000:]
