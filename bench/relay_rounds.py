"""The relay bench's throughput rounds: each publisher through the same backlog, timed at one reader,
in an order turned each round."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import psycopg
from cpu import measured  # bench/cpu.py
from debezium import OnOutbox  # bench/debezium.py
from psycopg import sql
from relay_backlog import create_topic, delete_topic, fill  # bench/relay_backlog.py
from relay_peers import LABELS, PEERS, RUN_LABELS, RUNS, raw_producer, read_alone  # bench/relay_peers.py
from relay_runner import RelayProcess  # bench/relay_runner.py
from throughput import timed  # bench/throughput.py

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Cluster


def throughput_rounds(
    args: argparse.Namespace,
    url: DatabaseUrl,
    bootstrap: str,
    topic: str,
    peers: dict[str, OnOutbox],
    tmp: Path,
    cluster: Cluster | None,
) -> list[dict[str, dict[str, Any]]]:
    """The warm-up rounds, then the counted ones (returned): every publisher once a round, and on the
    three-broker cluster the raw producer and the relay; then the read alone (`read`), for the
    machine's bound; each round's rates printed."""

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

    def read() -> dict[str, Any]:
        """The backlog read alone (relay_peers.read_alone), with the machine's CPU while it ran."""
        rows, usage = measured(lambda: read_alone(url, args.batch_size))
        return {
            "rows": rows,
            "per_s": round(rows / usage.wall_s),
            "cpu_us_per_event": usage.cpu_us_per(rows),
            "cpu_us_by_component": usage.components_us_per(rows),
        }

    publishers = [*RUNS, *(name for name in peers if name in PEERS)]
    rounds = []
    for n in range(-args.warmup, args.rounds):
        turn = n % len(publishers)  # who goes first moves each round: no one always meets a fresh broker
        runs = {who: run(who) for who in publishers[turn:] + publishers[:turn]}
        if cluster is not None:
            runs |= {"raw_rf3": run("raw", cluster.bootstrap), "eos_rf3": run("eos", cluster.bootstrap)}
        runs["read"] = read()
        print(_round_line(n, runs), flush=True)
        if n >= 0:
            rounds.append(runs)
    return rounds


def bound(runs: dict[str, dict[str, Any]]) -> float | None:
    """The best relay / raw this machine allows in a round: all its cores busy at the least CPU per
    event a relay must spend, the raw producer's (the same records, transactions, broker and
    reader) plus the read of the same rows into Python (`read`). None without /proc/stat."""
    raw, read = runs["raw"]["cpu_us_per_event"], runs["read"]["cpu_us_per_event"]
    if raw is None or read is None:
        return None
    return round((os.cpu_count() or 1) * 1e6 / (raw + read) / runs["raw"]["steady_per_s"], 3)


def _round_line(n: int, runs: dict[str, dict[str, Any]]) -> str:
    """A round's rates, in the order they ran, with the relay's ratios to raw and at-least-once and
    the bound the machine sets."""
    rate = {who: r["steady_per_s"] for who, r in runs.items() if who != "read"}
    name = "warm-up" if n < 0 else f"round {n + 1}"
    cells = [f"{RUN_LABELS.get(who) or LABELS.get(who) or who} {per_s:,.0f}/s" for who, per_s in rate.items()]
    line = f"{name}: " + ", ".join(cells)
    cost = 1 - rate["eos"] / rate["alo"]
    line += f"; relay / raw {rate['eos'] / rate['raw']:.2f} (the machine allows {bound(runs)})"
    return line + f", exactly-once cost {cost:.1%}"
