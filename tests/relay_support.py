"""Shared pieces of the relay tests: writers with known commit order, relay processes, the check."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_events
from outbox_dev.jvm import kafka_tools
from tests.cli import outbox
from tests.helpers import REPO, Job, committed_messages, unique


@dataclass
class Committed:
    """What writers know they committed: per key, event ids in commit order."""

    by_key: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, event_ids: list[str]) -> None:
        with self.lock:
            self.by_key[key].extend(event_ids)

    @classmethod
    def merged(cls, *batches: Committed) -> Committed:
        """What several groups of writers committed, one after the other."""
        merged = cls()
        for batch in batches:
            for key, events in batch.by_key.items():
                merged.add(key, events)
        return merged

    @property
    def count(self) -> int:
        with self.lock:
            return sum(len(ids) for ids in self.by_key.values())


class Writers:
    """Threads that commit outbox events; each key belongs to one writer, so its commit order is known.

    Commits are delayed at random, so transactions overlap and commit out of
    id order: the case where an `id > last_id` relay loses rows.
    """

    def __init__(self, url: DatabaseUrl, topic: str, writers: int = 4, keys_per_writer: int = 5) -> None:
        self.url, self.topic = url, topic
        self.committed = Committed()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(w, keys_per_writer), daemon=True) for w in range(writers)
        ]

    def start(self, transactions: int | None = None, max_delay: float = 0.02) -> Writers:
        self.transactions, self.max_delay = transactions, max_delay
        for t in self.threads:
            t.start()
        return self

    def _run(self, writer: int, keys: int) -> None:
        rng = random.Random(writer)
        done = 0
        try:
            with psycopg.connect(self.url.libpq) as conn:
                while not self.stop.is_set() and (self.transactions is None or done < self.transactions):
                    key = f"w{writer}-k{rng.randrange(keys)}"
                    ids = [uuid.uuid4() for _ in range(rng.randint(1, 3))]
                    events = [
                        Event(self.topic, {"event_id": str(e), "key": key, "n": i}, key=key, event_id=e)
                        for i, e in enumerate(ids)
                    ]
                    with conn.transaction():
                        add_events(conn, events)
                        time.sleep(rng.uniform(0, self.max_delay))
                    self.committed.add(key, [str(e.event_id) for e in events])
                    done += 1
        except BaseException as exc:  # surfaced by join()
            self.errors.append(exc)

    def join(self) -> None:
        for t in self.threads:
            t.join(120)
        assert not self.errors, self.errors


# Timeouts under which a relay halted on a poison row tries it again after about 12 s, not 30
# (RelaySettings.halt_wait): for the tests that wait for that try.
SHORT_HALT = ("--kafka-timeout", "4", "--database-timeout", "4")


def relay_job(
    tmp: Path, env: dict[str, str], name: str, *flags: str, pause_at: str = "none", label: str | None = None
) -> tuple[Job, Path]:
    """Start `outbox relay` as a killable child; returns the job and the file that resumes a pause."""
    label = label or unique("relay")
    resume = tmp / f"{label}.resume"
    job = Job(
        [
            str(REPO / "tests" / "jobs" / "relay_job.py"),
            pause_at,
            str(resume),
            "--name",
            name,
            "--metrics-address",
            "127.0.0.1:0",
            "--poll-interval",
            "0.2",
            "--max-retries",
            "100",
            "--log-format",
            "text",
            *flags,
        ],
        tmp / f"{label}.log",
        env,
    )
    return job, resume


def published(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, str, str]]:
    """(partition, offset, key, event_id) of every committed record of the topic."""
    return [
        (m.partition(), m.offset(), m.key().decode(), dict(m.headers() or [])["event_id"].decode())
        for m in committed_messages(bootstrap, topic, partitions)
    ]


def wait_published(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 90) -> list:
    deadline = time.monotonic() + timeout
    while True:
        records = published(bootstrap, topic, partitions)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def assert_exactly_once(
    records: list[tuple[int, int, str, str]],
    committed: Committed,
    *,
    may_repeat: Collection[str] = (),
    phantoms: Collection[str] = (),
) -> None:
    """Every committed event once, nothing else, and per key in commit order in one partition.

    may_repeat: events that may come out more than once (republished after the
    database went back in time); phantoms: events published and then lost by the
    database (a failover to an asynchronous replica, a restore), so in no writer's
    committed list any more. Order is checked on first appearances.
    """
    seen = [event for _, _, _, event in records]
    counts = Counter(seen)
    duplicates = {e for e, n in counts.items() if n > 1} - set(may_repeat)
    assert not duplicates, f"{len(duplicates)} events published more than once, e.g. {sorted(duplicates)[:3]}"
    expected = {e for ids in committed.by_key.values() for e in ids}
    missing, extra = expected - set(seen), set(seen) - expected - set(phantoms)
    assert not missing, f"{len(missing)} committed events never published, e.g. {sorted(missing)[:3]}"
    assert not extra, f"{len(extra)} published events no writer committed, e.g. {sorted(extra)[:3]}"
    by_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for partition, offset, key, event in records:
        by_key[key].append((partition, offset, event))
    for key, ids in committed.by_key.items():
        got = sorted(by_key[key])
        assert len({p for p, _, _ in got}) == 1, f"key {key} spread over partitions"
        first = [e for e in dict.fromkeys(e for _, _, e in got) if e in expected]
        assert first == ids, f"key {key}: published order differs from commit order"


def check_two_readers(
    bootstrap: str, topic: str, partitions: int, committed: Committed, url: DatabaseUrl, timeout: float = 180
) -> list[tuple[int, int, str, str]]:
    """Every record, read by both readers: ours (read_committed) and Kafka's own console consumer
    (read_committed), each with all committed events once, per key in commit order, nothing else
    (so no aborted record); and `outbox verify` against the committed events. Returns our records."""
    ours = wait_published(bootstrap, topic, partitions, committed.count, timeout=timeout)
    assert_exactly_once(ours, committed)
    theirs = [
        (r.partition, r.offset, r.key or "", r.headers["event_id"])
        for r in kafka_tools.console_consume(bootstrap, topic, expected=bool(ours))
    ]
    assert_exactly_once(theirs, committed)
    assert sorted(theirs) == sorted(ours)
    # The source is what the writers committed (the relay may have cleaned the outbox up since).
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS checked_events (topic text, event_id uuid)")
        conn.execute("DELETE FROM checked_events WHERE topic = %s", [topic])
        with conn.cursor().copy("COPY checked_events FROM STDIN") as copy:
            for event in (e for ids in committed.by_key.values() for e in ids):
                copy.write_row((topic, event))
    source = f"SELECT event_id::text FROM checked_events WHERE topic = '{topic}'"
    verify = outbox(
        "verify", topic, "--bootstrap-servers", bootstrap, "--source-sql", source, "--url", url.raw, "--json"
    )
    assert verify.code == 0, verify.out
    assert f'"records": {committed.count}' in verify.out.splitlines()[-1]
    return ours


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a key (Utils.murmur2, toPositive, mod)."""
    m, r, length = 0x5BD1E995, 24, len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


ACTIVE = "relay: active"


def outbox_rows(url: DatabaseUrl) -> int:
    with psycopg.connect(url.libpq) as conn:
        return int(conn.execute("SELECT count(*) FROM outbox_events").fetchone()[0])  # type: ignore[index]


def terminate(job: Job) -> int:
    """SIGTERM, and the relay's exit code."""
    os.kill(job.process.pid, signal.SIGTERM)
    return job.wait(30)
