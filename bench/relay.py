"""The outbox relay beside its limit, an at-least-once relay, and Debezium, in one run.

Writes N outbox rows of ~SIZE bytes, COPY by COPY of 50,000 rows, then publishes them, in the
same batch size, four ways:
  raw:           a confluent-kafka transactional producer, rows already in memory,
                 one transaction per batch (the limit: no Postgres, no position record);
  exactly-once:  the relay (snapshot-delta reads, Kafka transaction with the position);
  at-least-once: the same relay without Kafka transactions (records, flush, position, flush);
  Debezium:      the PostgreSQL connector with the outbox EventRouter on a Kafka Connect
                 standalone worker (at least once), and again on a distributed worker with
                 KIP-618's exactly-once source support (bench/debezium.py), each reading the
                 same backlog, written the same way into an outbox table of its own while it
                 is stopped, from its replication slot.
Each is timed the same way (bench/throughput.py): at one read_committed reader in a process of
its own, from its BATCH-th event read to its last, with the machine's CPU in that time; its
start-up (publisher started -> first event read) is reported apart. The relays run as `outbox
relay` processes, as users run them, each under a new name with cleanup off, so each publishes
all N rows; what a run published is dropped after it, so every run meets the same broker. They
run in turn, WARMUP rounds uncounted and then ROUNDS counted, in an order rotated each round;
the ratios are medians of each round's own ratios, and each round's are kept too. Where the
relay's time went comes from its own per-step counters (outbox_relay_step_seconds).
Then commit-to-visible latency at each of RATES, ROUNDS times, every run printed (the target is
on the worst), the relay with cleanup and without it: writers commit at a steady rate while one
publisher runs; a read_committed consumer stamps each arrival; p50/p99 of arrival minus
commit return. Last, the fault comparison: writers at 2,000/s for 12 s, the publisher killed
-9 halfway and started again at once; duplicates and missing on the topic, counted, with each
publisher's offset flush beside its duplicates (Debezium at Connect's default of 60 s and at
1 s, flushed before the kill; the relay at least once, which records its position after each
batch). Then one transaction of 30,000 events written with one COPY, the publisher killed -9
as soon as the bench reads the first of them; where events are missing, the bench says which
LSN they share with events that came out (a probe slot, test_decoding). The exit status is 1
if the relay lost or repeated an event.
With --cluster (the default), each round also runs the raw producer and the exactly-once relay
against a three-broker cluster (topics with replication factor 3, min.insync.replicas 2),
on the same rows: the cost of replication, as their ratios to the one broker's runs.

    python bench/relay.py [--events 200000] [--size 200] [--batch-size 5000] [--rounds 3]
                          [--warmup 1] [--rates 1000,10000] [--seconds 10] [--no-debezium] [--no-cluster]
                          [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services (PostgreSQL
with wal_level=logical, which Debezium needs; a server of your own must have it too).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, cast

import flags  # bench/flags.py
import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cpu import measured  # bench/cpu.py
from debezium import OnOutbox  # bench/debezium.py
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from services import services  # bench/services.py
from throughput import reader, timed  # bench/throughput.py

from outbox import logs, migrate
from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.kafka import client_settings
from outbox.relay import Relay, RelaySettings
from outbox.relay.kafka import PRODUCER_DEFAULTS
from outbox.relay.metrics import STEPS as RELAY_STEPS
from outbox.writer import Event, add_events
from outbox_dev.debezium import Debezium
from outbox_dev.kafka import Cluster
from outbox_dev.process import free_port, spawn

PARTITIONS = 3
PROBE = f"bench_relay_probe_{os.getpid()}"  # the temporary slot that tells each row's LSN in a fault
# Where the relay's batches spent their time in a latency run (from its own histograms).
STEPS = (
    "fetches",
    "fetch_ms_mean",
    "transactions",
    "transaction_ms_mean",
    "cleanups",
    "cleanup_ms_mean",
    "commit_to_produce_p50_ms",
    "commit_to_produce_p99_ms",
    "produce_to_read_p50_ms",
    "produce_to_read_p99_ms",
)
# Each Debezium's copy of the outbox table: its slot reads only what is written there.
PEERS = {"debezium": "dbz", "debezium_eos": "dbz_eos"}  # at least once (standalone), exactly once
FLUSHED = {"debezium_flush_1s": "dbz_flush"}  # the standalone worker again, its offsets flushed each second
FLUSH_MS = 1000
LABELS = {
    "debezium": "Debezium",
    "debezium_eos": "Debezium exactly-once",
    "debezium_flush_1s": "Debezium, offsets flushed every 1 s",
    "relay_at_least_once": "relay at least once",
}
# When each publisher records how far it got, which is what a kill -9 replays from: beside its duplicates.
FLUSHES = {
    "relay": "in each Kafka transaction, with its records",
    "relay_at_least_once": "after each batch is flushed",
    "debezium": "every 60 s (offset.flush.interval.ms, Connect's default)",
    "debezium_flush_1s": f"every {FLUSH_MS / 1000:.0f} s (offset.flush.interval.ms)",
    "debezium_eos": "in each poll's Kafka transaction (KIP-618)",
}
# The throughput runs of a round, before any rotation: the JSON's names for their rates.
RUNS = {"raw": "raw_producer", "eos": "relay_exactly_once", "alo": "relay_at_least_once"}
RUN_LABELS = {
    "raw": "raw transactional producer",
    "eos": "relay, exactly-once",
    "alo": "relay, at-least-once",
    "raw_rf3": "RF 3: raw",
    "eos_rf3": "RF 3: relay",
}


def create_topic(bootstrap: str, name: str | None = None) -> str:
    name = name or f"bench.relay.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    # The broker's own replication: 1 on one broker, 3 on the dev cluster.
    for future in admin.create_topics([NewTopic(name, PARTITIONS)]).values():
        future.result(30)
    return name


def delete_topic(bootstrap: str, name: str) -> None:
    """Drop what a run published, so later runs meet a broker no fuller than the first did."""
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.delete_topics([name]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)


def fill(url: DatabaseUrl, topic: str, count: int, size: int, schema: str = "public") -> None:
    """The backlog: `count` rows of about `size` bytes, one COPY and commit per 50,000."""
    note = "x" * max(0, size - 40)
    with psycopg.connect(url.libpq) as conn:
        for start in range(0, count, 50_000):
            add_events(
                conn,
                [
                    Event(topic, {"n": n, "note": note}, key=f"key-{n % 1000}")
                    for n in range(start, min(count, start + 50_000))
                ],
                schema=schema,
            )
            conn.commit()


def raw_producer(url: DatabaseUrl, bootstrap: str, batch: int, topic: str) -> None:
    """The limit: rows in memory, one Kafka transaction per batch, same headers as the relay's."""
    with psycopg.connect(url.libpq) as conn:
        rows = conn.execute(
            "SELECT event_id, key, value, header_keys, header_values FROM outbox_events ORDER BY id"
        ).fetchall()
    producer = Producer(
        client_settings(
            {
                **PRODUCER_DEFAULTS,
                "bootstrap.servers": bootstrap,
                "transactional.id": f"bench-raw-{uuid.uuid4()}",
            },
            "producer",
        )
    )
    producer.init_transactions(30)
    for start in range(0, len(rows), batch):
        producer.begin_transaction()
        for event_id, key, value, hkeys, hvalues in rows[start : start + batch]:
            headers = [("event_id", str(event_id).encode()), *zip(hkeys or (), hvalues or (), strict=True)]
            producer.produce(topic, value, key, headers=headers)
        producer.commit_transaction(60)
    producer.flush(30)


class RelayProcess:
    """`outbox relay` in its own process, as users run it, under a new name with cleanup off (so it
    publishes every row): started, and at its stop, where its publishing thread's time went."""

    def __init__(self, url: DatabaseUrl, bootstrap: str, work: Path, batch: int, exactly_once: bool) -> None:
        self.url, self.bootstrap, self.work = url, bootstrap, work
        self.flags = ["--no-cleanup", "--batch-size", str(batch)]
        self.flags += ["--delivery", "exactly-once" if exactly_once else "at-least-once"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.steps: dict[str, float] = {}  # step -> seconds, over the whole run

    def start(self) -> None:
        name, self.address = f"bench-{uuid.uuid4().hex[:8]}", f"127.0.0.1:{free_port()}"
        log = self.work / f"{name}.log"
        self.proc = relay_spawn(self.url, self.bootstrap, name, log, self.address, *self.flags)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.steps = {
            s.labels["step"]: s.value
            for family in text_string_to_metric_families(_get(self.address, "/metrics") or "")
            for s in family.samples
            if s.name == "outbox_relay_step_seconds_total"
        }
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)
        self.proc = None


def relay_run(settings: RelaySettings, count: int) -> dict[str, Any]:
    """Run the relay until it has published `count` rows: its rate over the rows after its first
    batch, and where its time went (us per event, summed over its batches)."""
    relay = Relay(settings)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    labels = {"relay": settings.name, "shard": "0/1"}

    def sample(metric: str) -> float:
        return relay.metrics.registry.get_sample_value(metric, labels) or 0.0

    def until(events: float) -> None:
        # Sampled every 5 ms: a batch takes 10-100 ms here, and the rate is timed from the first.
        while sample("outbox_relay_events_published_total") < events:
            time.sleep(0.005)
            if not thread.is_alive():
                raise SystemExit(f"relay {settings.name} stopped early")

    until(min(settings.batch_size, count))
    t0, first = time.perf_counter(), sample("outbox_relay_events_published_total")
    until(count)
    elapsed = time.perf_counter() - t0
    relay.stop.set()
    thread.join(30)
    if first >= count:
        raise SystemExit(
            f"relay {settings.name} published all {count:,} rows before its first batch was timed:"
            " more --events"
        )
    stages = {
        step: sample(f"outbox_relay_{step}_seconds_sum") / count * 1e6 for step in ("fetch", "transaction")
    }
    return {"steady_per_s": (count - first) / elapsed, "stages_us": stages}


class Arrivals(threading.Thread):
    """A read_committed consumer of one topic that stamps each event id's first arrival."""

    def __init__(self, bootstrap: str, topic: str, id_header: str = tables.EVENT_ID_HEADER) -> None:
        super().__init__(daemon=True)
        self.id_header = id_header
        self.consumer = reader(bootstrap)
        self.consumer.subscribe([topic])
        self.first: dict[bytes, float] = {}
        self.produced: dict[bytes, float] = {}  # event id -> the record's timestamp (when it was produced)
        self.records = 0
        self.stop = threading.Event()

    def run(self) -> None:
        # poll, not consume(n, timeout): consume waits for n records or the timeout, and
        # would stamp an arrival up to the timeout late.
        while not self.stop.is_set():
            m = self.consumer.poll(0.05)
            if m is not None and m.error() is None:
                self.records += 1
                # Every publisher here writes its event id header, as bytes.
                event_id = cast(bytes, dict(m.headers() or [])[self.id_header])
                self.first.setdefault(event_id, time.time())
                self.produced.setdefault(event_id, m.timestamp()[1] / 1000)
        self.consumer.close()

    def wait_for(self, count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.first) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.first) >= count

    def steady_rate(self, skip: int) -> float:
        """Events per second after the first `skip` arrived (the relay's steady state skips a batch too)."""
        times = sorted(self.first.values())
        if len(times) <= skip + 1:
            return 0.0
        return (len(times) - 1 - skip) / (times[-1] - times[skip])

    def close(self) -> None:
        self.stop.set()
        self.join(10)


@contextlib.contextmanager
def our_relay(
    url: DatabaseUrl, bootstrap: str, work: Path, cleanup: bool = True
) -> Iterator[dict[str, float]]:
    """`outbox relay` in its own process, as users run it and as Debezium runs in its JVM;
    yields a dict that gets, at the end, where its batches spent their time (its /metrics)."""
    name, address = f"bench-lat-{uuid.uuid4().hex[:6]}", f"127.0.0.1:{free_port()}"
    log = work / f"{name}.log"
    proc = relay_spawn(url, bootstrap, name, log, address, *([] if cleanup else ["--no-cleanup"]))
    stats: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while (_get(address, "/healthz") or "").strip() != "active":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the relay did not become active in 60 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield stats
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(_get(address, "/metrics") or "")
            for s in family.samples
        }
        for step, plural in (("fetch", "fetches"), ("transaction", "transactions"), ("cleanup", "cleanups")):
            count = samples.get(f"outbox_relay_{step}_seconds_count", 0.0)
            total = samples.get(f"outbox_relay_{step}_seconds_sum", 0.0)
            stats[f"{step}_ms_mean"] = round(total / count * 1000, 1) if count else 0.0
            stats[plural] = count
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def _get(address: str, path: str) -> str | None:
    """The body of http://address/path (any status), or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as refused:  # /healthz says 503 until the relay is active
        return str(refused.read().decode())
    except OSError:
        return None


@contextlib.contextmanager
def debezium_running(dbz: Debezium) -> Iterator[dict[str, float]]:
    dbz.start()
    try:
        yield {}
    finally:
        dbz.kill(signal.SIGTERM)


def latency(
    url: DatabaseUrl,
    bootstrap: str,
    rate: int,
    seconds: float,
    publisher: ContextManager[dict[str, float]],
    schema: str,
) -> dict[str, Any]:
    """Commit events at a steady `rate`/s; measure commit return -> read_committed arrival.

    One event per transaction up to 1,000/s; above, 2 writers each commit
    rate/1,000 events per transaction, 500 times a second.
    """
    topic = create_topic(bootstrap)
    if schema == "public":
        with psycopg.connect(url.libpq, autocommit=True) as conn:
            # Each run on an empty outbox, with no stopped relay's position left: it would keep
            # cleanup from deleting what that relay never published (`outbox relays forget`).
            names = (tables.OUTBOX_EVENTS, tables.RELAY_POSITIONS)
            conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(sql.Identifier(n) for n in names)))
    per_txn = max(1, rate // 1000)
    committed: dict[bytes, float] = {}
    arrivals = Arrivals(bootstrap, topic)

    def write(share: int) -> None:
        interval = share * per_txn / rate
        with psycopg.connect(url.libpq) as conn:
            next_at = time.monotonic()
            end = next_at + seconds
            while next_at < end:
                events = [
                    Event(topic, {"at": time.time()}, key=f"k{(next_at * 1000 + i) % 97:.0f}")
                    for i in range(per_txn)
                ]
                add_events(conn, events, schema=schema)
                conn.commit()
                now = time.time()
                for event in events:
                    committed[str(event.event_id).encode()] = now
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    def run() -> None:
        writers = [threading.Thread(target=write, args=(2,)) for _ in range(2)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        arrivals.wait_for(len(committed), 30)

    with publisher as stats:
        arrivals.start()
        time.sleep(2)  # consumer assigned, publisher active
        _, usage = measured(run)  # the machine's bound: how many cores the run kept busy, and who
        arrivals.close()
    seen = [e for e in committed if e in arrivals.first]
    waits = sorted(arrivals.first[e] - committed[e] for e in seen)
    # Where an event's wait went: commit -> produced (the publisher: woken, read, handed to
    # the producer) and produced -> read (linger, the Kafka transaction, the consumer's fetch).
    # The record timestamp is the producer's clock, this machine's; Connect sets its own.
    to_produce = sorted(arrivals.produced[e] - committed[e] for e in seen)
    to_read = sorted(arrivals.first[e] - arrivals.produced[e] for e in seen)
    return {
        "events": len(committed),
        "rate_per_s": len(committed) / seconds,
        "p50_ms": _ms(waits, 0.50),
        "p99_ms": _ms(waits, 0.99),
        "max_ms": _ms(waits, 1.0),
        "commit_to_produce_p50_ms": _ms(to_produce, 0.50),
        "commit_to_produce_p99_ms": _ms(to_produce, 0.99),
        "produce_to_read_p50_ms": _ms(to_read, 0.50),
        "produce_to_read_p99_ms": _ms(to_read, 0.99),
        "missing": len(committed) - len(waits),
        "cores_busy": round(usage.cores_busy() or 0.0, 2),
        "cores_by_component": {k: round(v / usage.wall_s, 2) for k, v in usage.components.items()},
        **stats,
    }


def _busy(run: dict) -> str:
    """The machine's share in a latency run: a tail on cores all busy is the machine's."""
    shares = sorted(run["cores_by_component"].items(), key=lambda kv: -kv[1])
    who = ", ".join(f"{name} {cores:.2f}" for name, cores in shares if cores >= 0.05)
    return f"{run['cores_busy']:.2f} of {os.cpu_count()} cores busy ({who})"


def _ms3(run: dict[str, float]) -> str:
    return f"{run['p50_ms']:.0f}/{run['p99_ms']:.0f}/{run['max_ms']:.0f} ms"


def _ms(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted seconds, in ms, by nearest rank; NaN of nothing."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] * 1000


def fault(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    rate: int = 2000,
    seconds: float = 12.0,
) -> dict[str, object]:
    """Writers at `rate`/s for `seconds`, 10 events a transaction; the publisher is killed -9
    halfway and started again at once.

    Then every committed event is looked for on the topic: duplicates and missing, counted, and
    the missing placed (`losses`).
    """
    topic = create_topic(bootstrap)
    row: dict[bytes, int] = {}  # event id -> its place in commit order
    with lsn_probe(url) as probe:
        start()
        arrivals = Arrivals(bootstrap, topic)
        arrivals.start()

        def write() -> None:
            per_txn, interval = 10, 10 / rate
            with psycopg.connect(url.libpq) as conn:
                next_at = time.monotonic()
                end = next_at + seconds
                while next_at < end:
                    first = len(row)
                    events = [Event(topic, {"n": first}, key=f"k{i % 97}") for i in range(per_txn)]
                    add_events(conn, events, schema=schema)
                    conn.commit()
                    row.update((str(e.event_id).encode(), first + i) for i, e in enumerate(events))
                    next_at += interval
                    time.sleep(max(0.0, next_at - time.monotonic()))

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(seconds / 2)
        kill()
        seen = set(arrivals.first)
        start()
        writer.join()
        return losses(arrivals, row, seen, kill, probe, schema)


def fault_inside_transaction(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    size: int = 30_000,
) -> dict[str, object]:
    """One transaction of `size` events written with one COPY; the publisher killed -9 as soon as
    the bench reads the first of them from the topic, and started again at once.

    A COPY writes a heap page's rows as one WAL record, so they share a WAL position (an LSN): a
    reader that resumes from a position inside such a group may skip the rest of it.
    """

    def write(topic: str) -> dict[bytes, int]:
        events = [Event(topic, {"n": i}, key=f"k{i % 97}") for i in range(size)]
        with psycopg.connect(url.libpq) as conn:
            add_events(conn, events, schema=schema)
        return {str(e.event_id).encode(): i for i, e in enumerate(events)}

    return killed_at_first_read(url, bootstrap, schema, start, kill, write)


def killed_at_first_read(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    write: Callable[[str], dict[bytes, int]],
    id_header: str = tables.EVENT_ID_HEADER,
    table: tuple[str, str] = (tables.OUTBOX_EVENTS, "event_id"),
) -> dict[str, object]:
    """`write(topic)` (one transaction; event id -> place) while the publisher runs, which is killed
    -9 as soon as the bench reads the first event, and started again at once; then `losses`."""
    topic = create_topic(bootstrap)
    with lsn_probe(url) as probe:
        start()
        arrivals = Arrivals(bootstrap, topic, id_header)
        arrivals.start()
        time.sleep(3)  # the reader's group joined: its first arrivals are not late
        row = write(topic)
        deadline = time.monotonic() + 120
        while not arrivals.first and time.monotonic() < deadline:
            time.sleep(0.001)
        kill()
        seen = set(arrivals.first)
        start()
        return losses(arrivals, row, seen, kill, probe, schema, table)


@contextlib.contextmanager
def lsn_probe(url: DatabaseUrl) -> Iterator[psycopg.Connection | None]:
    """A session holding a logical slot (test_decoding, temporary: gone with the session however
    the bench ends), made before a fault's writes: it tells each written row's LSN. None where the
    server has no test_decoding: missing rows are then counted, not placed."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', true)", [PROBE])
        except psycopg.Error:
            yield None
        else:
            yield conn


def losses(
    arrivals: Arrivals,
    row: dict[bytes, int],
    seen: set[bytes],
    kill: Callable[[], None],
    probe: psycopg.Connection | None,
    schema: str,
    table: tuple[str, str] = (tables.OUTBOX_EVENTS, "event_id"),
) -> dict[str, object]:
    """Once every committed event (`row`: event id -> its place) is out, or 120 s: duplicates and
    missing, and which rows are missing, with the LSNs they share with rows that came out.
    `seen`: what the bench had read when it killed the publisher; `table`: the table the rows
    were written to, and its event id column."""
    arrivals.wait_for(len(row), 120)
    time.sleep(2)  # late duplicates
    arrivals.close()
    kill()
    missing = sorted(row[e] for e in row.keys() - arrivals.first.keys())
    out: dict[str, object] = {
        "committed": len(row),
        "read_at_kill": len(seen),
        "duplicates": arrivals.records - len(arrivals.first),
        "missing": len(missing),
    }
    if probe is not None:  # a COPY's rows share a WAL position a page at a time
        out["wal_positions"] = _wal_positions(probe, schema, table[0])
    if missing:
        out["missing_rows"] = _spans(missing)
        if probe is not None:
            out["missing_by_lsn"] = _by_lsn(probe, schema, table, row, set(missing), {row[e] for e in seen})
    return out


def _wal_positions(probe: psycopg.Connection, schema: str, table: str) -> int:
    """How many WAL positions the rows written to the table since the probe began took."""
    (count,) = probe.execute(
        "SELECT count(DISTINCT lsn) FROM pg_logical_slot_peek_changes(%s, NULL, NULL) WHERE data LIKE %s",
        [PROBE, f"table {schema}.{table}: INSERT:%"],
    ).fetchone() or (0,)
    return int(count)


def _spans(rows: list[int]) -> str:
    """Sorted row numbers as runs: "25-60, 71"."""
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _by_lsn(
    probe: psycopg.Connection,
    schema: str,
    table: tuple[str, str],
    row: dict[bytes, int],
    missing: set[int],
    seen: set[int],
) -> list[dict[str, object]]:
    """For each LSN a missing row has: which of the transaction's rows have it, how many of them
    the bench had read when it killed the publisher, how many are missing."""
    changes = probe.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", [PROBE]
    ).fetchall()
    marker, written = f"{table[1]}[uuid]:'", f"table {schema}.{table[0]}: INSERT:"
    lsn_rows: dict[str, list[int]] = {}
    for lsn, data in changes:
        if data.startswith(written) and marker in data:
            event = data.split(marker, 1)[1].split("'", 1)[0].encode()
            if event in row:
                lsn_rows.setdefault(lsn, []).append(row[event])
    return [
        {
            "lsn": lsn,
            "rows": _spans(sorted(rows)),
            "read_at_kill": sum(r in seen for r in rows),
            "missing": sum(r in missing for r in rows),
        }
        for lsn, rows in sorted(lsn_rows.items())
        if missing.intersection(rows)
    ]


# The fault comparisons, each run on every publisher: the JSON key, how a line names it, the fault.
# A fault's injection: (url, bootstrap, schema, start, kill) -> what it found.
Inject = Callable[[DatabaseUrl, str, str, Callable[[], None], Callable[[], None]], dict[str, object]]
FAULTS: dict[str, tuple[str, Inject]] = {
    "faults": ("mid-stream", fault),
    "faults_inside_transaction": ("inside one transaction", fault_inside_transaction),
}


def relay_spawn(
    url: DatabaseUrl, bootstrap: str, name: str, log: Path, metrics: str, *flags: str
) -> subprocess.Popen[bytes]:
    """`python -m outbox relay --name NAME` as a child of this process, its output in `log`."""
    env = {**os.environ, "DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    argv = [sys.executable, "-m", "outbox", "relay", "--name", name, "--metrics-address", metrics, *flags]
    return spawn(argv, log, die_with_parent=signal.SIGKILL, env=env)


def relay_process(
    url: DatabaseUrl, bootstrap: str, work: Path, delivery: str = "exactly-once", *flags: str
) -> tuple[Callable[[], None], Callable[[], None]]:
    """`outbox relay` as a child process: (start, kill -9), for the fault comparison."""
    name = f"bench-fault-{uuid.uuid4().hex[:6]}"
    proc: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        log = work / f"{name}.log"
        proc.append(relay_spawn(url, bootstrap, name, log, "off", "--delivery", delivery, *flags))

    def kill() -> None:
        if proc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc[-1].pid, signal.SIGKILL)
            proc.pop().wait(30)

    return start, kill


def main() -> int:
    parser = flags.parser(__doc__, events=200_000, size_help="bytes per event value")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument(
        "--rounds", type=int, default=3, help="raw, exactly-once, at-least-once, Debezium, in turn"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (the broker's JIT, caches)"
    )
    parser.add_argument("--rates", default="1000,10000", help="events/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=10, help="length of each latency run")
    parser.add_argument("--no-debezium", action="store_true", help="measure the relay alone")
    parser.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure on a three-broker cluster, replication factor 3 (the cost of replication)",
    )
    args = parser.parse_args()
    if args.events < 2 * args.batch_size:
        # Steady state leaves out the first batch: with one batch there is nothing to time.
        parser.error(f"--events must be at least twice --batch-size ({args.batch_size}), for a steady state")
    rates = [int(r) for r in args.rates.split(",")]
    logs.configure("text", logging.WARNING)  # the relay's warnings, with what they are about

    with (
        tempfile.TemporaryDirectory(prefix="bench-relay-", dir=os.environ.get("TMPDIR")) as tmp,
        services(Path(tmp) / "services") as (url, bootstrap),
    ):
        for schema in {**PEERS, **FLUSHED}.values():
            migrate.upgrade(url, schema)
        topic = create_topic(bootstrap)
        fill(url, topic, args.events, args.size)
        peers = {
            name: OnOutbox(Path(tmp) / name, url, bootstrap, schema, exactly_once=name == "debezium_eos")
            for name, schema in ({} if args.no_debezium else PEERS).items()
        }
        # In the mid-stream fault only: a standalone worker that flushes its offsets every second.
        peers |= {
            name: OnOutbox(Path(tmp) / name, url, bootstrap, schema, flush_ms=FLUSH_MS)
            for name, schema in ({} if args.no_debezium else FLUSHED).items()
        }
        cluster = Cluster(Path(tmp) / "cluster", size=3) if args.cluster else None
        try:
            if cluster is not None:
                create_topic(cluster.bootstrap, topic)
            result = measure(args, rates, url, bootstrap, topic, peers, Path(tmp), cluster)
        finally:
            if cluster is not None:
                cluster.close()
            for dbz in peers.values():
                dbz.drop_slot()  # a slot left behind would hold WAL on the server for ever
    flags.finish("relay", report(result), args)
    relay_faults = [result[kind]["relay"] for kind in FAULTS]
    lost = any(lat["missing"] for lat in result["latency"])
    return 1 if lost or any(f["missing"] or f["duplicates"] for f in relay_faults) else 0


def measure(
    args: argparse.Namespace,
    rates: list[int],
    url: DatabaseUrl,
    bootstrap: str,
    topic: str,
    peers: dict[str, OnOutbox],
    tmp: Path,
    cluster: Cluster | None,
) -> dict:
    for dbz in (d for name, d in peers.items() if name in PEERS):
        dbz.start()  # creates the slot and the publication: what is written from now on, it reads
        dbz.kill(signal.SIGTERM)

    def again(servers: str = bootstrap) -> None:
        delete_topic(servers, topic)
        create_topic(servers, topic)

    def run(who: str, servers: str = bootstrap) -> dict[str, Any]:
        """One publisher through the whole backlog, timed at the reader; the topic made anew after."""
        relay = None
        if who == "raw":
            start, stop = (lambda: raw_producer(url, servers, args.batch_size, topic)), (lambda: None)
        elif who in ("eos", "alo"):
            relay = RelayProcess(url, servers, tmp, args.batch_size, exactly_once=who == "eos")
            start, stop = relay.start, relay.stop
        else:
            dbz = peers[who]
            with psycopg.connect(url.libpq, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(dbz.schema, tables.OUTBOX_EVENTS)))
            fill(url, topic, args.events, args.size, dbz.schema)  # written while it is stopped
            start, stop = dbz.start, lambda: dbz.kill(signal.SIGTERM)  # a clean stop: offsets flushed
        result = timed(servers, topic, args.events, args.batch_size, start, stop)
        if relay is not None:
            result["steps_us_per_event"] = {k: v / args.events * 1e6 for k, v in relay.steps.items()}
        again(servers)
        return result

    publishers = [*RUNS, *(name for name in peers if name in PEERS)]
    rounds = []
    for n in range(-args.warmup, args.rounds):
        turn = n % len(publishers)  # who goes first moves each round: no one always meets a fresh broker
        runs = {who: run(who) for who in publishers[turn:] + publishers[:turn]}
        if cluster is not None:
            runs |= {"raw_rf3": run("raw", cluster.bootstrap), "eos_rf3": run("eos", cluster.bootstrap)}
        print(_round_line(n, runs), flush=True)
        if n >= 0:
            rounds.append(runs)
    if cluster is not None:
        cluster.close()  # its three JVMs would take CPU from the latency runs
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox_events")

    latencies = []
    for rate in rates:
        for n in range(1, args.rounds + 1):
            # Without cleanup, the same relay: what deleting published rows adds to the tail.
            ours = latency(url, bootstrap, rate, args.seconds, our_relay(url, bootstrap, tmp), "public")
            bare = latency(
                url, bootstrap, rate, args.seconds, our_relay(url, bootstrap, tmp, False), "public"
            )
            entry = {"rate": rate, "round": n, "relay": ours, "relay_no_cleanup": bare}
            entry["missing"] = ours["missing"]
            print(
                f"latency at {rate}/s, round {n}: relay p50/p99/max {_ms3(ours)};"
                f" {ours['transactions']:.0f} batches of read {ours['fetch_ms_mean']} ms,"
                f" produce + commit {ours['transaction_ms_mean']} ms; {ours['cleanups']:.0f} cleanups"
                f" of {ours['cleanup_ms_mean']} ms (means); commit -> produced p50/p99"
                f" {ours['commit_to_produce_p50_ms']:.0f}/{ours['commit_to_produce_p99_ms']:.0f} ms,"
                f" produced -> read {ours['produce_to_read_p50_ms']:.0f}"
                f"/{ours['produce_to_read_p99_ms']:.0f} ms;"
                f" without cleanup p50/p99/max {_ms3(bare)}; {_busy(ours)}",
                flush=True,
            )
            for name, dbz in ((n, d) for n, d in peers.items() if n in PEERS):
                theirs = latency(url, bootstrap, rate, args.seconds, debezium_running(dbz), dbz.schema)
                for split in [k for k in theirs if k.startswith(("commit_to_", "produce_to_"))]:
                    del theirs[split]  # Connect stamps records with its own choice of time
                entry[name] = theirs
                print(
                    f"latency at {rate}/s, round {n}: {LABELS[name]} p50/p99/max {_ms3(theirs)};"
                    f" {_busy(theirs)}",
                    flush=True,
                )
            latencies.append(entry)

    result: dict = {"args": vars(args), "rounds": rounds, "latency": latencies}
    for kind, (what, inject) in FAULTS.items():
        faulted = {"relay": ("public", *relay_process(url, bootstrap, tmp))}
        if kind == "faults":  # beside Debezium at least once: the relay at least once
            faulted["relay_at_least_once"] = ("public", *relay_process(url, bootstrap, tmp, "at-least-once"))
        for name, dbz in peers.items():
            if kind == "faults" or name in PEERS:
                faulted[name] = (dbz.schema, dbz.start, functools.partial(dbz.kill, signal.SIGKILL))
        result[kind] = {}
        for who, (schema, start, kill) in faulted.items():
            if who in FLUSHED and kind == "faults":
                # Its slot made now: made with the others, it would first decode all the WAL since.
                peers[who].start()
                peers[who].kill(signal.SIGTERM)
            found = inject(url, bootstrap, schema, start, kill)
            result[kind][who] = {**found, "records_position": FLUSHES[who]}
            print(f"kill -9 {what}, {LABELS.get(who, who)}: {_lost(result[kind][who])}", flush=True)
    return result


def report(result: dict) -> dict:
    """Prints the figures; returns them as the JSON object."""
    rounds, median = result["rounds"], statistics.median
    worst = {  # the relay's worst round at each rate: the target holds in every round or not at all
        rate: max((e["relay"] for e in result["latency"] if e["rate"] == rate), key=lambda v: v["p99_ms"])
        for rate in sorted({e["rate"] for e in result["latency"]})
    }

    def rate(who: str) -> int:
        return round(median(r[who]["steady_per_s"] for r in rounds))

    def ratios(a: str, b: str) -> list[float]:
        return [round(r[a]["steady_per_s"] / r[b]["steady_per_s"], 3) for r in rounds]

    def cpu(who: str) -> float:
        return _round(median(r[who]["cpu_us_per_event"] or 0 for r in rounds))

    eos_vs_raw, eos_vs_alo = ratios("eos", "raw"), ratios("eos", "alo")
    cores = os.cpu_count() or 1
    out = {
        "events": result["args"]["events"],
        "event_bytes": result["args"]["size"],
        "batch_size": result["args"]["batch_size"],
        "rounds": len(rounds),
        "warmup_rounds": result["args"]["warmup"],
        "timed_at": "a read_committed reader in its own process, from the first batch read to the last",
        **{f"{name}_per_s": rate(who) for who, name in RUNS.items()},
        "ratio_relay_vs_raw": round(median(eos_vs_raw), 3),
        "target_vs_raw": 1.0,
        "exactly_once_cost": round(median(1 - x for x in eos_vs_alo), 3),
        "target_exactly_once_cost": 0.10,
        "ratio_rounds": {
            "ratio_relay_vs_raw": eos_vs_raw,
            "exactly_once_cost": [round(1 - x, 3) for x in eos_vs_alo],
        },
        # CPU in the steady state, the machine's (broker, PostgreSQL, the reader included), and by
        # whom; start-up apart.
        **{f"{name}_cpu_us_per_event": cpu(who) for who, name in RUNS.items()},
        "cpu_us_by_component": {
            name: rounds[len(rounds) // 2][who]["cpu_us_by_component"] for who, name in RUNS.items()
        },
        "cores_busy": {
            name: round(median(r[who]["cores_busy"] or 0 for r in rounds), 2) for who, name in RUNS.items()
        },
        "startup_s": {
            name: round(median(r[who]["startup_s"] for r in rounds), 2) for who, name in RUNS.items()
        },
        # Where the relay's publishing thread spent its time, us per event (its step counters).
        "relay_steps_us_per_event": {
            name: {
                step: round(median(r[who]["steps_us_per_event"].get(step, 0.0) for r in rounds), 2)
                for step in RELAY_STEPS
            }
            for who, name in RUNS.items()
            if who != "raw"
        },
        # The most this machine gives each, all its cores busy at that CPU cost per event.
        "bound_per_s": {name: round(cores * 1e6 / cpu(who)) for who, name in RUNS.items() if cpu(who)},
        # The best relay / raw this machine allows at the relay's CPU cost: below 1.0, the target is
        # out of reach here until the relay costs less CPU per event than `cpu_us_per_event_for_raw`.
        "bound_ratio_relay_vs_raw": round(cores * 1e6 / cpu("eos") / rate("raw"), 3) if cpu("eos") else None,
        "cpu_us_per_event_for_raw": round(cores * 1e6 / rate("raw"), 1),
        "latency": [
            {
                "rate_per_s": e["rate"],
                "round": e["round"],
                **{k: _lat(v) for k, v in e.items() if k in ("relay", "relay_no_cleanup", *PEERS)},
            }
            for e in result["latency"]
        ],
        "relay_p99_ms_worst": {str(rate): round(e["p99_ms"], 1) for rate, e in worst.items()},
        # How full the machine was in that round: a tail on all cores busy is the machine's bound.
        "relay_p99_worst_cores_busy": {str(rate): e["cores_busy"] for rate, e in worst.items()},
        "target_p99_ms": {"1000": 100, "10000": 250},
        **{kind: result[kind] for kind in FAULTS},
    }
    if "eos_rf3" in rounds[0]:
        out |= {
            "rf3_raw_producer_per_s": rate("raw_rf3"),
            "rf3_relay_exactly_once_per_s": rate("eos_rf3"),
            "rf3_relay_cpu_us_per_event": cpu("eos_rf3"),
            "ratio_rf3_vs_1_raw": median(ratios("raw_rf3", "raw")),
            "ratio_rf3_vs_1_relay": median(ratios("eos_rf3", "eos")),
            "ratio_rf3_relay_vs_rf3_raw": median(ratios("eos_rf3", "raw_rf3")),
        }
    for name in (n for n in PEERS if n in rounds[0]):
        out |= {
            f"{name}_per_s": rate(name),
            f"ratio_relay_vs_{name}": median(ratios("eos", name)),
            f"{name}_cpu_us_per_event": cpu(name),
            f"{name}_startup_s": round(median(r[name]["startup_s"] for r in rounds), 2),
        }
        out["ratio_rounds"][f"ratio_relay_vs_{name}"] = ratios("eos", name)
    if any(n in rounds[0] for n in PEERS):
        out["target_vs_debezium"] = 2.0
    print(
        f"medians of {len(rounds)} rounds (after {out['warmup_rounds']} uncounted), {out['events']:,} events"
        f" of {out['event_bytes']} B, each timed at a read_committed reader; CPU is the machine's in the"
        " steady state (broker, PostgreSQL and the reader included):"
    )
    for who, name in RUNS.items():
        print(
            f"{RUN_LABELS[who]:<27}: {out[f'{name}_per_s']:>9,} events/s, {out[f'{name}_cpu_us_per_event']}"
            f" us CPU/event, {out['cores_busy'][name]} of {cores} cores busy; the machine's bound at that"
            f" cost {out['bound_per_s'].get(name, 0):,}/s; start-up {out['startup_s'][name]} s"
        )
    for name, steps in out["relay_steps_us_per_event"].items():
        cells = ", ".join(f"{step} {us}" for step, us in steps.items())
        print(f"  {name.replace('_', ' ')}, its publishing thread, us per event: {cells}")
    for name in (n for n in PEERS if f"{n}_per_s" in out):
        print(
            f"{LABELS[name] + ' (Connect)':<27}: {out[f'{name}_per_s']:>9,} events/s,"
            f" {out[f'{name}_cpu_us_per_event']} us CPU/event; start-up {out[f'{name}_startup_s']} s"
        )
        print(
            f"{'relay / ' + LABELS[name]:<27}: {out[f'ratio_relay_vs_{name}']:>9} (target >= 2.0;"
            f" rounds {out['ratio_rounds'][f'ratio_relay_vs_{name}']})"
        )
    print(
        f"relay / raw                : {out['ratio_relay_vs_raw']:>9} (target >= 1.0 in every round;"
        f" rounds {eos_vs_raw}); the machine's bound at the relay's CPU cost:"
        f" {out['bound_ratio_relay_vs_raw']} (1.0 needs at most {out['cpu_us_per_event_for_raw']} us"
        " per event)"
    )
    print(
        f"cost of exactly-once       : {out['exactly_once_cost']:>9.1%} (target <= 10%;"
        f" rounds {out['ratio_rounds']['exactly_once_cost']})"
    )
    if "ratio_rf3_vs_1_relay" in out:
        print(
            f"RF 3 cluster (3 brokers)   : raw {out['rf3_raw_producer_per_s']:,}/s,"
            f" relay {out['rf3_relay_exactly_once_per_s']:,}/s,"
            f" {out['rf3_relay_cpu_us_per_event']} us CPU/event (machine-wide)"
        )
        print(
            f"RF 3 / one broker          : raw {out['ratio_rf3_vs_1_raw']},"
            f" relay {out['ratio_rf3_vs_1_relay']} (the cost of replication);"
            f" on RF 3, relay / raw {out['ratio_rf3_relay_vs_rf3_raw']}"
        )
    for e in out["latency"]:
        latency_cells = [
            f"{who.replace('_', ' ')} p50 {v['p50_ms']} p99 {v['p99_ms']} max {v['max_ms']} ms"
            f" ({v['rate_per_s']}/s reached, {v['missing']} not seen)"
            for who, v in e.items()
            if isinstance(v, dict)
        ]
        print(f"commit-to-visible at {e['rate_per_s']}/s, round {e['round']}: " + "; ".join(latency_cells))
    for rate, p99 in out["relay_p99_ms_worst"].items():
        target, busy = out["target_p99_ms"].get(rate), out["relay_p99_worst_cores_busy"][rate]
        print(
            f"relay p99 at {rate}/s, worst of {len(rounds)} rounds: {p99} ms (target <= {target} ms);"
            f" {busy} of {os.cpu_count()} cores busy in that round"
        )
    for kind, (what, _) in FAULTS.items():
        for who, f in out[kind].items():
            print(f"kill -9 {what}, {LABELS.get(who, who)}: {_lost(f)}")
    return out


def _round_line(n: int, runs: dict[str, dict[str, Any]]) -> str:
    """A round's rates, in the order they ran, with the relay's ratios to raw and at-least-once."""
    rate = {who: r["steady_per_s"] for who, r in runs.items()}
    name = "warm-up" if n < 0 else f"round {n + 1}"
    cells = [f"{RUN_LABELS.get(who) or LABELS.get(who) or who} {per_s:,.0f}/s" for who, per_s in rate.items()]
    line = f"{name}: " + ", ".join(cells)
    cost = 1 - rate["eos"] / rate["alo"]
    return line + f"; relay / raw {rate['eos'] / rate['raw']:.2f}, exactly-once cost {cost:.1%}"


def _lost(f: dict) -> str:
    """A fault's line: what was committed and read at the kill, duplicates, and what is missing where."""
    line = (
        f"{f['committed']:,} committed, {f['read_at_kill']:,} read when it was killed;"
        f" {f['duplicates']} duplicates, {f['missing']} missing;"
        f" its position recorded {f['records_position']}"
    )
    if f["missing"]:
        line += f" (rows {f['missing_rows']}, in commit order)"
    for group in f.get("missing_by_lsn", []):
        line += (
            f"; LSN {group['lsn']} holds rows {group['rows']}: {group['read_at_kill']} of them read"
            f" before the kill, {group['missing']} missing"
        )
    return line


def _lat(v: dict) -> dict:
    return {
        **{k: v[k] for k in STEPS if k in v},
        "p50_ms": round(v["p50_ms"], 1),
        "p99_ms": round(v["p99_ms"], 1),
        "max_ms": round(v["max_ms"], 1),
        "rate_per_s": round(v["rate_per_s"]),
        "missing": v["missing"],
        "cores_busy": v["cores_busy"],
        "cores_by_component": v["cores_by_component"],
    }


def _round(x: float) -> float:
    return round(x, 1)


if __name__ == "__main__":
    raise SystemExit(main())
