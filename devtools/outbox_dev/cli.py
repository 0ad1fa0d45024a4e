"""`outbox dev up | down | status | broker | connect`: throwaway PostgreSQL, Kafka and Spark Connect here.

`up` prints `export NAME=value` lines, so `eval "$(outbox dev up)"` points
every other command, the demo and the tests at the services it started.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from pathlib import Path

from outbox.core.config import OUTBOX_DEV_DIR
from outbox_dev.stack import DEFAULT_SERVICES, Stack, Status

DEFAULT_DIR = ".outbox-dev"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = commands.add_parser(
        "dev", help="start, stop or show local PostgreSQL and Kafka (and a schema registry)"
    )
    actions = dev.add_subparsers(dest="action", required=True, metavar="ACTION")

    def with_dir(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "--dir",
            type=Path,
            default=Path(os.environ.get(OUTBOX_DEV_DIR, DEFAULT_DIR)),
            help=f"where data, logs and state live (env {OUTBOX_DEV_DIR}, default {DEFAULT_DIR})",
        )
        return p

    up = with_dir(actions.add_parser("up", help="start what is not running; print export lines"))
    up.add_argument("--pg-port", type=int, help="PostgreSQL port (default: a free one)")
    up.add_argument("--kafka-port", type=int, help="Kafka port (default: a free one)")
    up.add_argument(
        "--brokers",
        type=int,
        default=os.environ.get("OUTBOX_DEV_BROKERS", "1"),
        help="Kafka nodes: 1, or a cluster such as 3 where topics get 3 replicas, 2 in sync"
        " (env OUTBOX_DEV_BROKERS, default 1)",
    )
    up.add_argument(
        "--registry",
        action="store_true",
        help="also a schema registry (Apicurio, Confluent's API under /apis/ccompat/v7):"
        " exports SCHEMA_REGISTRY_URL",
    )
    up.add_argument("--registry-port", type=int, help="the registry's port (default: a free one)")
    up.add_argument(
        "--durable",
        action="store_true",
        help="PostgreSQL with fsync and synchronous commits on, as production runs it (default: off, fast)",
    )
    up.set_defaults(handler=cmd_up)
    with_dir(actions.add_parser("down", help="stop the services and delete their data")).set_defaults(
        handler=cmd_down
    )
    with_dir(actions.add_parser("status", help="print export lines; exit 1 if not running")).set_defaults(
        handler=cmd_status
    )
    broker = with_dir(
        actions.add_parser("broker", help="stop, kill -9, pause, resume or start one Kafka node")
    )
    broker.add_argument(
        "broker_action",
        choices=["stop", "kill", "pause", "resume", "start"],
        metavar="ACTION",
        help="stop (controlled), kill (-9), pause (SIGSTOP), resume (SIGCONT) or start",
    )
    broker.add_argument("node", type=int, help="the node's id, 1..N")
    broker.set_defaults(handler=cmd_broker)
    connect = with_dir(
        actions.add_parser(
            "connect",
            help="run a Spark Connect server on loopback until Ctrl-C; print its export line",
            description="A Spark Connect server from the installed pyspark's jars, on 127.0.0.1: jobs"
            " reach it with SPARK_REMOTE (or SparkSession.builder.remote). Runs in the foreground"
            " until SIGINT or SIGTERM. Its batches and tasks run with this Python and environment.",
        )
    )
    connect.add_argument("--port", type=int, help="its port (default: a free one)")
    connect.add_argument("--master", default="local[2]", help="its cluster (default local[2])")
    connect.set_defaults(handler=cmd_connect)


def export_lines(status: Status) -> list[str]:
    """Shell lines for the running services; given ones are named, not echoed (secrets)."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in status.exports.items()]
    lines += [
        f"# {var} is set in the environment: using it, not starting {name}"
        for name, var in status.given.items()
    ]
    return lines


def cmd_up(args: argparse.Namespace) -> int:
    services = (*DEFAULT_SERVICES, "registry") if args.registry else DEFAULT_SERVICES
    status = Stack(args.dir, services=services).up(
        ports={"postgres": args.pg_port, "kafka": args.kafka_port, "registry": args.registry_port},
        durable=args.durable,
        brokers=args.brokers,
    )
    print("\n".join(export_lines(status)))
    return 0


def cmd_broker(args: argparse.Namespace) -> int:
    print(f"# {Stack(args.dir).broker(args.broker_action, args.node)}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = Stack(args.dir).down()
    print(f"# stopped: {', '.join(stopped)}" if stopped else "# nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    status = Stack(args.dir).status()
    print("\n".join(export_lines(status)))
    for name in status.dead:
        print(f"# {name} is not running (run `outbox dev up`)")
    if not status.running and not status.given:
        print("# nothing is running (run `outbox dev up`)")
    return 1 if status.dead or not (status.running or status.given) else 0


def cmd_connect(args: argparse.Namespace) -> int:
    from outbox_dev.connect import ConnectServer

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with ConnectServer(args.dir / "connect", master=args.master, port=args.port) as server:
        print(f"export SPARK_REMOTE={server.url}", flush=True)
        print(f"# Spark Connect server running (log {server.log}); Ctrl-C stops it", flush=True)
        while not stop.wait(1):
            if server.process is None or server.process.poll() is not None:
                print(f"# the server exited; its log: {server.log}", file=sys.stderr)
                return 1
    return 0
