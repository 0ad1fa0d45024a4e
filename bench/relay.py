"""The outbox relay beside its limit, an at-least-once relay, and Debezium, in one run.

Writes N outbox rows of ~SIZE bytes, COPY by COPY of 50,000 rows, then publishes them, in the
same batch size, four ways:
  raw:           a confluent-kafka transactional producer, rows already in memory as they are
                 sent, one transaction per batch (the limit: no Postgres, no position record);
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
relay's time went comes from its own per-step counters (outbox_relay_step_seconds). Each round
ends with the rows read alone into Python (a bare SELECT, batch by batch): the raw producer's CPU
per event plus that read's is the least a relay like ours spends, and all cores busy at that cost
give the best relay / raw the machine allows in the round (bound_ratio_relay_vs_raw).
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
                          [--fault-seconds 12] [--fault-events 30000] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services (PostgreSQL
with wal_level=logical, which Debezium needs; a server of your own must have it too).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import tempfile
from pathlib import Path

import flags  # bench/flags.py
import psycopg
from debezium import OnOutbox  # bench/debezium.py
from relay_backlog import create_topic, fill  # bench/relay_backlog.py
from relay_faults import FAULTS, FLUSHES, fault_runs, killed_at_first_read  # bench/relay_faults.py
from relay_latency import latency_rounds  # bench/relay_latency.py
from relay_peers import FLUSH_MS, FLUSHED, LABELS, PEERS, debezium_peers  # bench/relay_peers.py
from relay_report import report  # bench/relay_report.py
from relay_rounds import throughput_rounds  # bench/relay_rounds.py
from relay_runner import relay_process, relay_run  # bench/relay_runner.py
from services import services  # bench/services.py

from outbox import logs, migrate
from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Cluster

# What bench/scale.py and bench/debezium_layout.py take from this script (`from relay import ...`),
# now defined beside it.
__all__ = [
    "FLUSHES",
    "FLUSH_MS",
    "LABELS",
    "create_topic",
    "killed_at_first_read",
    "relay_process",
    "relay_run",
]


def arguments() -> argparse.Namespace:
    """The flags every bench takes (bench/flags.py), and the relay bench's own."""
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
    parser.add_argument(
        "--fault-seconds",
        type=float,
        default=12,
        help="length of each mid-stream kill -9 run, at 2,000 events/s",
    )
    parser.add_argument(
        "--fault-events", type=int, default=30_000, help="events of the one transaction killed -9 inside"
    )
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
    return args


def main() -> int:
    args = arguments()
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
        peers = debezium_peers(args, tmp, url, bootstrap)
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
    """Every run in turn: the throughput rounds, the latency runs, and each fault on every publisher."""
    for dbz in (d for name, d in peers.items() if name in PEERS):
        dbz.start()  # creates the slot and the publication: what is written from now on, it reads
        dbz.kill(signal.SIGTERM)
    rounds = throughput_rounds(args, url, bootstrap, topic, peers, tmp, cluster)
    if cluster is not None:
        cluster.close()  # its three JVMs would take CPU from the latency runs
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox_events")
    latencies = latency_rounds(args, rates, url, bootstrap, peers, tmp)
    result: dict = {"args": vars(args), "rounds": rounds, "latency": latencies}
    sized = {
        "faults": {"seconds": args.fault_seconds},
        "faults_inside_transaction": {"size": args.fault_events},
    }
    for kind, (what, inject) in FAULTS.items():
        run = functools.partial(inject, **sized[kind])
        result[kind] = fault_runs(kind, what, run, url, bootstrap, tmp, peers)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
