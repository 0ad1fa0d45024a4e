"""`outbox relay`: publish the outbox table to Kafka, exactly once, until SIGTERM.

Every flag has an environment variable, so the same container image runs
anywhere with only its environment changed.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from outbox._core.config import OUTBOX_SCHEMA, bootstrap_servers, database_url, schema_name
from outbox.errors import error
from outbox.logs import configure
from outbox.relay.kafka import PRODUCER_DEFAULTS
from outbox.relay.metrics import RelayMetrics, serve
from outbox.relay.outbox_table import SYNCHRONOUS_COMMIT
from outbox.relay.poison import DEAD_LETTER, HALT
from outbox.relay.position import Shard
from outbox.relay.relay import POSITIONS_TOPIC, Relay, RelaySettings
from outbox.stopping import STOP, catch_stop_signals

log = logging.getLogger("outbox.relay")

_SECRET_WORDS = ("password", "secret", "key", "token", "jaas")


@dataclass(frozen=True)
class Setting:
    """A flag with an environment variable: the flag wins, then the variable, then the default.

    The default reaches argparse as text, so a malformed variable is reported
    like a malformed flag. The relay table in docs/relay.md is checked against this list.
    """

    flag: str
    env: str
    default: str | None
    help: str
    type: Callable[[str], object] = str
    choices: tuple[str, ...] | None = None


SETTINGS = (
    Setting(
        "--name", "OUTBOX_RELAY_NAME", None, "relay name: its position and transactional.id derive from it"
    ),
    Setting("--shard", "OUTBOX_RELAY_SHARD", "0/1", "I/N: publish only keys hashing to shard I of N"),
    Setting("--batch-size", "OUTBOX_RELAY_BATCH_SIZE", "5000", "rows per Kafka transaction at most", int),
    Setting(
        "--poll-interval",
        "OUTBOX_RELAY_POLL_INTERVAL",
        "1",
        "seconds between reads when no NOTIFY arrives",
        float,
    ),
    Setting(
        "--on-poison",
        "OUTBOX_RELAY_ON_POISON",
        HALT,
        "a row Kafka refuses for good: halt (keep order, alert)"
        " or dead-letter (copy to relay_dead_letters, go on)",
        choices=(HALT, DEAD_LETTER),
    ),
    Setting(
        "--positions-topic",
        "OUTBOX_RELAY_POSITIONS_TOPIC",
        POSITIONS_TOPIC,
        "compacted topic for relay positions (created if missing)",
    ),
    Setting(
        "--retention",
        "OUTBOX_RELAY_RETENTION",
        "0",
        "keep published rows this many seconds before deleting them",
        float,
    ),
    Setting(
        "--delivery",
        "OUTBOX_RELAY_DELIVERY",
        "exactly-once",
        "at-least-once: no Kafka transactions (for brokers without them; may duplicate on failure)",
        choices=("exactly-once", "at-least-once"),
    ),
    Setting(
        "--kafka-config",
        "OUTBOX_RELAY_KAFKA_CONFIG",
        None,
        "file of KEY=VALUE librdkafka settings, keeps secrets out of argv",
        Path,
    ),
    Setting(
        "--metrics-address",
        "OUTBOX_RELAY_METRICS_ADDRESS",
        "0.0.0.0:9400",
        "HOST:PORT for /metrics and /healthz, or off",
    ),
    Setting(
        "--kafka-timeout",
        "OUTBOX_RELAY_KAFKA_TIMEOUT",
        "30",
        "seconds a transactional call (init, commit, abort) waits for Kafka before it counts as timed"
        " out; a commit then is asked again for twice as long before a new producer settles it",
        float,
    ),
    Setting(
        "--database-timeout",
        "OUTBOX_RELAY_DATABASE_TIMEOUT",
        "30",
        "seconds a PostgreSQL round trip may take before the relay drops the connection and starts over"
        " (a partition leaves it open, unanswered); the server's statement_timeout and keepalives follow it",
        float,
    ),
    Setting(
        "--max-retries",
        "OUTBOX_RELAY_MAX_RETRIES",
        "10",
        "failed sessions in a row before exiting (backoff 0.5 s doubling to 30 s)",
        int,
    ),
    Setting(
        "--synchronous-commit",
        "OUTBOX_RELAY_SYNCHRONOUS_COMMIT",
        "on",
        "how durable a delta's mark must be before its Kafka commit: local (this server's disk),"
        " on (and the synchronous standbys', if the server names any), remote_write, remote_apply",
        choices=SYNCHRONOUS_COMMIT,
    ),
    Setting(
        "--log-format",
        "OUTBOX_LOG_FORMAT",
        "json",
        "log lines as JSON objects or text",
        choices=("json", "text"),
    ),
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "relay",
        help="publish outbox rows to Kafka exactly once (a daemon)",
        description="Publish committed outbox rows to Kafka exactly once, in commit order per key."
        " Runs until SIGTERM or SIGINT; start more with the same --name as standbys.",
    )
    p.add_argument("--url", help="PostgreSQL URL (env DATABASE_URL)")
    p.add_argument("--bootstrap-servers", help="Kafka host:port list (env KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--schema", help=f"schema of the outbox table (env {OUTBOX_SCHEMA}, default public)")
    for setting in SETTINGS:
        default = f", default {setting.default}" if setting.default is not None else ""
        p.add_argument(
            setting.flag,
            type=setting.type,
            choices=setting.choices,
            default=os.environ.get(setting.env) or setting.default,
            help=f"{setting.help} (env {setting.env}{default})",
        )
    p.add_argument("--no-cleanup", action="store_true", help="never delete published rows")
    p.add_argument(
        "-X",
        dest="kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka producer setting (security, compression, linger.ms, ...); repeatable",
    )
    p.set_defaults(handler=cmd_relay)


def kafka_settings(pairs: list[str], file: Path | None) -> dict[str, object]:
    """-X pairs over the config file's; later wins."""
    lines: list[tuple[str, str]] = []
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise error("RELAY_KAFKA_CONFIG_UNREADABLE", file=file, reason=exc.strerror) from None
        lines += [
            (str(file), line)
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    lines += [("-X", pair) for pair in pairs]
    settings: dict[str, object] = {}
    for source, line in lines:
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise error("RELAY_KAFKA_SETTING_MALFORMED", source=source, key=line.split("=")[0])
        settings[key.strip()] = value.strip()
    return settings


def redacted(settings: dict[str, object]) -> dict[str, object]:
    return {k: ("***" if any(w in k for w in _SECRET_WORDS) else v) for k, v in settings.items()}


def cmd_relay(args: argparse.Namespace) -> int:
    """The daemon; `args.pause`, when a fault test's job injects one, holds it at named points."""
    configure(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    if not args.name:
        raise error("RELAY_NAME_REQUIRED")
    kafka = kafka_settings(args.kafka, args.kafka_config)
    settings = RelaySettings(
        url=database_url(args.url),
        bootstrap=bootstrap_servers(args.bootstrap_servers),
        name=args.name,
        shard=Shard.parse(args.shard),
        schema=schema_name(args.schema),
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        on_poison=args.on_poison,
        positions_topic=args.positions_topic,
        cleanup=not args.no_cleanup,
        retention=args.retention,
        kafka=kafka,
        exactly_once=args.delivery == "exactly-once",
        max_retries=args.max_retries,
        synchronous_commit=args.synchronous_commit,
        kafka_timeout=args.kafka_timeout,
        database_timeout=args.database_timeout,
    )
    # Set by SIGTERM or SIGINT, also one that came while the relay was still starting.
    stop = STOP
    catch_stop_signals()
    metrics = RelayMetrics(settings.name, str(settings.shard))
    server = None
    if args.metrics_address != "off":
        server = serve(metrics, args.metrics_address)
        host, port = cast(tuple[str, int], server.server_address[:2])
        log.info("serving /metrics and /healthz", extra={"url": f"http://{host}:{port}"})
    log.info(
        "starting",
        extra={
            "relay": settings.name,
            "shard": str(settings.shard),
            "database": settings.url.safe,
            "bootstrap": settings.bootstrap,
            "delivery": args.delivery,
            "kafka": redacted({**PRODUCER_DEFAULTS, **kafka}),
        },
    )
    try:
        Relay(settings, metrics, stop, pause=getattr(args, "pause", None)).run()
    finally:
        if server is not None:
            server.shutdown()
    log.info("exiting", extra={"relay": settings.name, "shard": str(settings.shard)})
    return 0
