"""Throughput and latency of the outbox relay, beside its limit and an at-least-once relay, in one run.

Writes N outbox rows of ~SIZE bytes once, then publishes the same rows, in the same batch size, three ways:
  raw:           a confluent-kafka transactional producer, rows already in memory,
                 one transaction per batch (the limit: no Postgres, no position record);
  exactly-once:  the relay (snapshot-delta reads, Kafka transaction with the position);
  at-least-once: the same relay without Kafka transactions (records, flush, position, flush).
Each relay gets its own name and cleanup is off, so each publishes all N rows; what a run
published is dropped after it, so every run meets the same broker. Steady
state excludes the first batch. The three run in turn, ROUNDS times, and the ratios are
medians of each round's own ratios: on a shared 2-core machine a lone run of a second or
two swings by 2x, and side by side in time is the only fair comparison.
Then commit-to-visible latency: writers commit one event per transaction at a steady
RATE/s for SECONDS while the exactly-once relay runs; a read_committed consumer stamps
each arrival; p50/p99 of arrival minus commit return.

    python bench/relay.py [--events 200000] [--size 200] [--batch-size 5000] [--rounds 5]
                          [--rate 1000] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox import migrate
from outbox.config import DatabaseUrl
from outbox.dev.stack import running
from outbox.probe import quiet_kafka_config
from outbox.relay import Relay, RelaySettings
from outbox.relay.kafka import PRODUCER_DEFAULTS
from outbox.writer import Event, add_events

PARTITIONS = 3


def create_topic(bootstrap: str, name: str | None = None) -> str:
    name = name or f"bench.relay.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(quiet_kafka_config({"bootstrap.servers": bootstrap}))
    for future in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
        future.result(30)
    return name


def delete_topic(bootstrap: str, name: str) -> None:
    """Drop what a run published, so later runs meet a broker no fuller than the first did."""
    admin = AdminClient(quiet_kafka_config({"bootstrap.servers": bootstrap}))
    for future in admin.delete_topics([name]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)


def fill(url: DatabaseUrl, topic: str, count: int, size: int) -> None:
    note = "x" * max(0, size - 40)
    with psycopg.connect(url.libpq) as conn:
        for start in range(0, count, 50_000):
            add_events(
                conn,
                [
                    Event(topic, {"n": n, "note": note}, key=f"key-{n % 1000}")
                    for n in range(start, min(count, start + 50_000))
                ],
            )
            conn.commit()


def raw_producer(url: DatabaseUrl, bootstrap: str, batch: int) -> dict[str, float]:
    """The limit: rows in memory, one Kafka transaction per batch, same headers as the relay's."""
    with psycopg.connect(url.libpq) as conn:
        rows = conn.execute(
            "SELECT event_id, key, value, header_keys, header_values FROM outbox_events ORDER BY id"
        ).fetchall()
    topic = create_topic(bootstrap)
    producer = Producer(
        quiet_kafka_config(
            {
                **PRODUCER_DEFAULTS,
                "bootstrap.servers": bootstrap,
                "transactional.id": f"bench-raw-{uuid.uuid4()}",
            }
        )
    )
    producer.init_transactions(30)
    seconds = []
    for start in range(0, len(rows), batch):
        t0 = time.perf_counter()
        producer.begin_transaction()
        for event_id, key, value, hkeys, hvalues in rows[start : start + batch]:
            headers = [("event_id", str(event_id).encode()), *zip(hkeys or (), hvalues or (), strict=True)]
            producer.produce(topic, value, key, headers=headers)
        producer.commit_transaction(60)
        seconds.append(time.perf_counter() - t0)
    producer.flush(30)
    delete_topic(bootstrap, topic)
    steady = len(rows) - min(batch, len(rows))
    return {"steady_per_s": steady / sum(seconds[1:]) if len(seconds) > 1 else 0.0}


def relay_run(
    url: DatabaseUrl, bootstrap: str, batch: int, count: int, exactly_once: bool
) -> dict[str, float]:
    settings = RelaySettings(
        url=url,
        bootstrap=bootstrap,
        name=f"bench-{'eos' if exactly_once else 'alo'}-{uuid.uuid4().hex[:6]}",
        batch_size=batch,
        cleanup=False,
        exactly_once=exactly_once,
    )
    relay = Relay(settings)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    labels = {"relay": settings.name, "shard": "0/1"}

    def published() -> float:
        return relay.metrics.registry.get_sample_value("outbox_relay_events_published_total", labels) or 0.0

    # Polled every 50 ms: often enough to time, rarely enough not to compete for the GIL.
    while published() < min(batch, count):
        time.sleep(0.05)
    t0, first = time.perf_counter(), published()
    while published() < count:
        time.sleep(0.05)
        if not thread.is_alive():
            raise SystemExit("relay stopped early")
    elapsed = time.perf_counter() - t0
    relay.stop.set()
    thread.join(30)
    return {"steady_per_s": (count - first) / elapsed}


def latency(url: DatabaseUrl, bootstrap: str, rate: int, seconds: float) -> dict[str, float]:
    """Commit one event per transaction at `rate`/s; measure commit return -> read_committed arrival."""
    topic = create_topic(bootstrap)
    relay = Relay(RelaySettings(url=url, bootstrap=bootstrap, name=f"bench-lat-{uuid.uuid4().hex[:6]}"))
    relaying = threading.Thread(target=relay.run, daemon=True)
    relaying.start()
    committed: dict[bytes, float] = {}
    arrived: dict[bytes, float] = {}
    stop = threading.Event()

    def consume() -> None:
        consumer = Consumer(
            quiet_kafka_config(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"bench-{uuid.uuid4()}",
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 5,
                }
            )
        )
        consumer.subscribe([topic])
        while not stop.is_set():
            for m in consumer.consume(1000, 0.05):
                if m.error() is None:
                    arrived[dict(m.headers() or [])["event_id"]] = time.time()
        consumer.close()

    def write(share: int) -> None:
        interval = share / rate
        with psycopg.connect(url.libpq) as conn:
            next_at = time.monotonic()
            end = next_at + seconds
            while next_at < end:
                event = Event(topic, {"at": time.time()}, key=f"k{next_at % 97:.0f}")
                add_events(conn, [event])
                conn.commit()
                committed[str(event.event_id).encode()] = time.time()
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    time.sleep(2)  # consumer assigned, relay active
    writers = [threading.Thread(target=write, args=(2,)) for _ in range(2)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    deadline = time.monotonic() + 30
    while len(arrived) < len(committed) and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    relay.stop.set()
    reader.join(10)
    relaying.join(10)
    waits = sorted(arrived[e] - t for e, t in committed.items() if e in arrived)
    missing = len(committed) - len(waits)
    pick = lambda q: waits[min(len(waits) - 1, int(q * len(waits)))] * 1000  # noqa: E731
    return {
        "events": len(committed),
        "rate_per_s": len(committed) / seconds,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "max_ms": waits[-1] * 1000,
        "missing": missing,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="bytes per event value")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5, help="raw, exactly-once, at-least-once, in turn")
    parser.add_argument("--rate", type=int, default=1000, help="events/s for the latency run")
    parser.add_argument("--seconds", type=float, default=10, help="length of the latency run")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="bench-relay-", dir=os.environ.get("TMPDIR")) as tmp,
        running(Path(tmp) / "services") as started,
    ):
        env = {
            **started,
            **{k: v for k in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS") if (v := os.environ.get(k))},
        }
        url, bootstrap = DatabaseUrl.parse(env["DATABASE_URL"]), env["KAFKA_BOOTSTRAP_SERVERS"]
        migrate.upgrade(url, "public")
        topic = create_topic(bootstrap)
        fill(url, topic, args.events, args.size)

        def relayed(exactly_once: bool) -> float:
            rate = relay_run(url, bootstrap, args.batch_size, args.events, exactly_once)["steady_per_s"]
            delete_topic(bootstrap, topic)
            create_topic(bootstrap, topic)
            return rate

        rounds = []
        for n in range(1, args.rounds + 1):
            raw = raw_producer(url, bootstrap, args.batch_size)["steady_per_s"]
            eos, alo = relayed(exactly_once=True), relayed(exactly_once=False)
            rounds.append({"raw": raw, "eos": eos, "alo": alo})
            print(
                f"round {n}: raw {raw:,.0f}/s, exactly-once {eos:,.0f}/s ({eos / raw:.2f}),"
                f" at-least-once {alo:,.0f}/s"
            )
        with psycopg.connect(url.libpq, autocommit=True) as conn:
            conn.execute("TRUNCATE outbox_events")
        lat = latency(url, bootstrap, args.rate, args.seconds)

    result = {
        "events": args.events,
        "event_bytes": args.size,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "raw_producer_per_s": round(statistics.median([r["raw"] for r in rounds])),
        "relay_exactly_once_per_s": round(statistics.median([r["eos"] for r in rounds])),
        "relay_at_least_once_per_s": round(statistics.median([r["alo"] for r in rounds])),
        "ratio_relay_vs_raw": round(statistics.median([r["eos"] / r["raw"] for r in rounds]), 3),
        "ratio_relay_vs_raw_per_round": [round(r["eos"] / r["raw"], 3) for r in rounds],
        "target_vs_raw": 0.7,
        "exactly_once_cost": round(statistics.median([1 - r["eos"] / r["alo"] for r in rounds]), 3),
        "target_cost_at_most": 0.10,
        "latency_rate_per_s": round(lat["rate_per_s"]),
        "latency_p50_ms": round(lat["p50_ms"], 1),
        "latency_p99_ms": round(lat["p99_ms"], 1),
        "latency_max_ms": round(lat["max_ms"], 1),
        "target_p99_ms": 250,
        "latency_missing": lat["missing"],
    }
    print(f"medians of {args.rounds} rounds:")
    print(f"raw transactional producer    : {result['raw_producer_per_s']:>10,} events/s (the limit)")
    print(f"relay, exactly-once           : {result['relay_exactly_once_per_s']:>10,} events/s")
    print(f"relay, at-least-once          : {result['relay_at_least_once_per_s']:>10,} events/s")
    print(f"ratio exactly-once / raw      : {result['ratio_relay_vs_raw']:>10} (target >= 0.7)")
    print(f"cost of exactly-once          : {result['exactly_once_cost']:>10.1%} (target <= 10%)")
    print(
        f"commit-to-visible at {result['latency_rate_per_s']}/s : p50 {result['latency_p50_ms']} ms,"
        f" p99 {result['latency_p99_ms']} ms (target <= 250), max {result['latency_max_ms']} ms,"
        f" {lat['missing']} not seen"
    )
    if args.json:
        print(json.dumps(result))
    return 0 if lat["missing"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
