"""make demo: Kafka -> Spark -> PostgreSQL -> outbox relay -> Kafka, with kill -9s, checked record by record.

A producer fills an input topic in Kafka transactions (some aborted, some
events redelivered); a Spark job reads it with kafka_rc, squares each number
and writes it with PostgresSink and an outbox event in one transaction; the
relay publishes the outbox to an output topic. Meanwhile the Spark job and the
relay are killed -9 and started again, and the broker is killed and restarted.
At the end both topics are read back read_committed and compared: every
committed input event must come out exactly once, squared, in its account's
order, and nothing else; then `outbox trace` follows an event the Spark job
was killed with and the poison one the sink dead-lettered. Exit 0 only then.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console

from demos.loop import formats
from demos.loop.run import Loop, Settings
from demos.loop.show import Display, chart, table
from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError
from outbox.core.java import find_java
from outbox.core.probe import check_kafka
from outbox_dev.kafka import Broker, Cluster
from outbox_dev.process import free_port
from outbox_dev.stack import running


def _at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse type: a number of `kind`, at least `low`, with one clear line when it is not."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demos.loop", description=__doc__.splitlines()[0])
    p.add_argument(
        "--events", type=_at_least(1), default=30_000, help="distinct committed input events (default 30000)"
    )
    p.add_argument(
        "--accounts", type=_at_least(1), default=200, help="keys (accounts) the events are spread over"
    )
    p.add_argument(
        "--partitions", type=_at_least(1), default=4, help="partitions of the input and output topics"
    )
    p.add_argument(
        "--duration",
        type=_at_least(1.0, float),
        default=150.0,
        help="seconds to produce the input over, and to spread the kills over (default 150)",
    )
    p.add_argument(
        "--spark-kills", type=_at_least(0), default=5, help="kill -9s of the Spark job (default 5)"
    )
    p.add_argument("--relay-kills", type=_at_least(0), default=5, help="kill -9s of the relay (default 5)")
    p.add_argument(
        "--broker-restarts",
        type=_at_least(0),
        default=1,
        help="kill -9 and restart of the broker, or of a cluster's next node (default 1)",
    )
    p.add_argument(
        "--brokers",
        type=_at_least(1),
        default=1,
        help="Kafka nodes: 1, or a cluster (3: RF 3, min.insync 2) whose nodes are killed in turn"
        " (default 1; `make demo BROKERS=3`)",
    )
    p.add_argument(
        "--connect",
        action="store_true",
        help="run the Spark job as a Spark Connect client of a server of the demo's own; its kill -9s"
        " are of both (`make demo CONNECT=1`)",
    )
    p.add_argument(
        "--format",
        choices=formats.FORMATS,
        default=os.environ.get("OUTBOX_DEMO_FORMAT", "json"),
        help="the input's values: JSON, or Avro under a schema registry of the demo's own (env"
        " OUTBOX_DEMO_FORMAT; default json)",
    )
    p.add_argument("--no-chaos", action="store_true", help="kill nothing: a quiet run")
    p.add_argument("--seed", type=int, default=None, help="random seed for the input and the kill times")
    p.add_argument(
        "--drain-timeout",
        type=_at_least(1.0, float),
        default=180.0,
        help="seconds to wait for the output to catch up",
    )
    p.add_argument("--chart", type=Path, default=Path(".tmp/demo-loop.png"), help="where to save the chart")
    p.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("OUTBOX_DEMO_DIR", ".tmp/demo")),
        help="scratch directory, deleted at the end (env OUTBOX_DEMO_DIR)",
    )
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (the components' logs)")
    p.add_argument("--json", action="store_true", help="end with the verdict as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(log_path=False)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4))
    kills = {"spark": args.spark_kills, "relay": args.relay_kills, "broker": args.broker_restarts}
    if args.no_chaos:
        kills = dict.fromkeys(kills, 0)
    given_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given_kafka and kills["broker"]:
        console.print(
            "KAFKA_BOOTSTRAP_SERVERS is set: that broker is not ours to restart (no broker restart)"
        )
        kills["broker"] = 0
    settings = Settings(
        events=args.events,
        accounts=args.accounts,
        partitions=args.partitions,
        window=args.duration,
        kills=kills,
        seed=seed,
        drain_timeout=args.drain_timeout,
        connect=args.connect,
    )
    how = (", Spark Connect" if args.connect else "") + (", Avro values" if args.format == "avro" else "")
    console.print(f"demo: {args.events:,} events over {args.duration:.0f}s, kills {kills}, seed {seed}{how}")
    try:
        find_java(needed_by="The demo's Spark job and Kafka broker")
        for left in ("kafka", "checkpoint", "spark", "connect", "logs"):  # from a run that was killed
            shutil.rmtree(args.dir / left, ignore_errors=True)
        wanted = ["postgres", *(["registry"] if args.format == "avro" else [])]
        with running(args.dir / "services", services=wanted) as started:
            url = DatabaseUrl.parse(os.environ.get("DATABASE_URL") or started["DATABASE_URL"])
            registry = os.environ.get("SCHEMA_REGISTRY_URL") or started.get("SCHEMA_REGISTRY_URL")
            settings = replace(settings, registry=registry if args.format == "avro" else None)
            if given_kafka:
                check_kafka(given_kafka)
            broker = given_kafka or (
                Cluster(args.dir / "kafka", size=args.brokers)
                if args.brokers > 1
                else Broker(args.dir / "kafka", free_port())
            )
            try:
                with Display(console, args.events, {c: n for c, n in kills.items() if n}) as display:
                    outcome = Loop(settings, url, broker, args.dir, display).run()
            finally:
                if isinstance(broker, Broker):
                    broker.stop()
                elif isinstance(broker, Cluster):
                    broker.close()
    except OutboxError as exc:
        console.print(f"demo: error: {exc}", style="red", markup=False)
        return 2
    finally:
        if args.keep:
            console.print(f"kept {args.dir} (logs in {args.dir / 'logs'})")
        else:
            shutil.rmtree(args.dir, ignore_errors=True)
    v = outcome.verdict
    console.print()
    console.print(
        table(v, outcome.killed, outcome.exits, outcome.applied, outcome.latencies, outcome.warmups)
    )
    for line in v.examples:
        console.print(line, markup=False)
    for traced in outcome.traces:
        console.print()
        console.print(f"{traced.pick.why}:", markup=False, soft_wrap=True)
        console.print(f"$ {traced.command}", markup=False, highlight=False, soft_wrap=True)
        console.print(traced.output, markup=False, highlight=False, soft_wrap=True)
        if not traced.ok:
            console.print(f"FAILED: {traced.problem}", markup=False)
    chart(args.chart, outcome.timeline, outcome.latencies, v)
    ok = outcome.ok(kills)
    console.print(f"chart: {args.chart}")
    if outcome.killed != kills:
        console.print(f"FAILED: planned kills {kills}, done {outcome.killed}")
    console.print(
        "OK: every committed event came out once, squared, in order; nothing else did" if ok else "FAILED"
    )
    if args.json:
        print(
            json.dumps(
                {
                    **asdict(v),
                    "applied": outcome.applied,
                    "killed": outcome.killed,
                    "exits": outcome.exits,
                    "ok": ok,
                    "seed": seed,
                    "traces": [{"why": t.pick.why, "ok": t.ok, "problem": t.problem} for t in outcome.traces],
                }
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
