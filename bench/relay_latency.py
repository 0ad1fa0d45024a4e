"""The relay bench's latency runs: writers commit at a steady rate while one publisher runs, and a
read_committed consumer stamps each arrival; commit-to-visible, p50/p99, each round printed."""

from __future__ import annotations

import argparse
import math
import os
import threading
import time
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any, cast

import psycopg
from cpu import measured  # bench/cpu.py
from debezium import OnOutbox  # bench/debezium.py
from psycopg import sql
from relay_backlog import create_topic  # bench/relay_backlog.py
from relay_peers import LABELS, PEERS, debezium_running  # bench/relay_peers.py
from relay_runner import our_relay  # bench/relay_runner.py
from throughput import reader  # bench/throughput.py

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_events

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


def latency_rounds(
    args: argparse.Namespace,
    rates: list[int],
    url: DatabaseUrl,
    bootstrap: str,
    peers: dict[str, OnOutbox],
    tmp: Path,
) -> list[dict]:
    """At each rate, --rounds rounds of latency_round."""
    latencies = []
    for rate in rates:
        for n in range(1, args.rounds + 1):
            latencies.append(latency_round(args, rate, n, url, bootstrap, peers, tmp))
    return latencies


def latency_round(
    args: argparse.Namespace,
    rate: int,
    n: int,
    url: DatabaseUrl,
    bootstrap: str,
    peers: dict[str, OnOutbox],
    tmp: Path,
) -> dict:
    """Round n at one rate: the relay with cleanup and without, then each Debezium peer; each printed."""
    # Without cleanup, the same relay: what deleting published rows adds to the tail.
    ours = latency(url, bootstrap, rate, args.seconds, our_relay(url, bootstrap, tmp), "public")
    bare = latency(url, bootstrap, rate, args.seconds, our_relay(url, bootstrap, tmp, False), "public")
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
            f"latency at {rate}/s, round {n}: {LABELS[name]} p50/p99/max {_ms3(theirs)}; {_busy(theirs)}",
            flush=True,
        )
    return entry


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
