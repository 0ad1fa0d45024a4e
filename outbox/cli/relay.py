"""`outbox relay`: publish the outbox table to Kafka, exactly once, until SIGTERM.

Every flag has an environment variable, so the same container image runs
anywhere with only its environment changed.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from outbox.core import secrets
from outbox.core.config import OUTBOX_SCHEMA, bootstrap_servers, database_url, schema_name
from outbox.core.errors import OutboxError
from outbox.core.settings import Setting, boolean
from outbox.errors import error
from outbox.logs import configure
from outbox.relay import config_file
from outbox.relay.kafka import PRODUCER_DEFAULTS
from outbox.relay.metrics import RelayMetrics, serve
from outbox.relay.relay import Relay
from outbox.relay.settings import CONFIG, EXACTLY_ONCE, SETTINGS, RelaySettings
from outbox.stopping import STOP, bound_stop, catch_stop_signals

log = logging.getLogger("outbox.relay")

_SECRET_WORDS = ("password", "secret", "key", "token", "jaas", "oauthbearer.config")


class _Given(argparse.Action):
    """Stores a flag's value and notes it was given: a flag wins over the config file."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


class _FromEnv(str):
    """A flag's default taken from its environment variable: argparse parses it as it would the flag,
    and a value refused is named as the variable it came from."""


def _flag_type(setting: Setting[Any]) -> Callable[[str], object]:
    """argparse's `type` for a declared setting: its parser and checks, one line when they refuse."""

    def parse(text: str) -> object:
        try:
            return setting.read(text)
        except OutboxError as exc:
            given = f" (from the variable {setting.env})" if isinstance(text, _FromEnv) else ""
            raise argparse.ArgumentTypeError(f"{exc}{given}") from None

    return parse


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "relay",
        help="publish outbox rows to Kafka exactly once (a daemon)",
        description="Publish committed outbox rows to Kafka exactly once, in commit order per key."
        " Runs until SIGTERM or SIGINT; start more with the same --name as standbys.",
    )
    p.add_argument("--url", help="PostgreSQL URL (env DATABASE_URL, or DATABASE_URL_FILE: a file holding it)")
    p.add_argument("--bootstrap-servers", help="Kafka host:port list (env KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument("--schema", help=f"schema of the outbox table (env {OUTBOX_SCHEMA}, default public)")
    for setting in SETTINGS:
        assert setting.env is not None, setting.name  # every relay setting has its variable
        default = f", default {setting.shown}" if setting.shown is not None else ""
        switch = setting.parse is boolean  # given alone, it says true
        choices = ("true", "false") if switch else setting.choices
        p.add_argument(
            setting.name,
            action=_Given,
            type=_flag_type(setting),
            nargs="?" if switch else None,
            const="true" if switch else None,
            metavar=f"{{{','.join(choices)}}}" if choices else setting.key.upper(),
            default=_FromEnv(os.environ[setting.env]) if os.environ.get(setting.env) else setting.default,
            help=f"{setting.doc} (env {setting.env}{default})",
        )
    p.add_argument(
        "-X",
        dest="kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka producer setting (security, compression, linger.ms, ...); repeatable",
    )
    p.set_defaults(handler=cmd_relay)


def _with_config_file(args: argparse.Namespace) -> dict[str, str]:
    """The --config file's settings put in `args` where no flag or variable gives them; its
    librdkafka settings, which --kafka-config, -X and the secrets' files win over."""
    if args.config is None:
        return {}
    settings = {s.key: s for s in SETTINGS if s is not CONFIG}
    found = config_file.read(args.config, set(settings))
    given: set[str] = getattr(args, "given", set())
    for key, text in found.values.items():
        if key in config_file.CONNECTIONS:
            wins = [config_file.CONNECTIONS[key], *([secrets.DATABASE_URL_FILE] if key == "url" else [])]
            if getattr(args, key) is None and not any(os.environ.get(v) for v in wins):
                setattr(args, key, text)
            continue
        setting = settings[key]
        if key in given or os.environ.get(setting.env or ""):
            continue
        try:
            setattr(args, key, setting.read(text))
        except OutboxError as exc:
            raise error("RELAY_CONFIG_VALUE_INVALID", file=args.config, key=key, reason=exc.message) from None
    return found.kafka


def kafka_settings(
    pairs: list[str], file: Path | None, base: dict[str, str] | None = None
) -> dict[str, object]:
    """-X pairs over the --kafka-config file's, over `base` (the config file's, the secrets'); later wins."""
    lines: list[tuple[str, str]] = []
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise error("RELAY_KAFKA_CONFIG_UNREADABLE", file=file, reason=exc.strerror) from None
        lines += [
            (f"{file}, line {n}", line)
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith(("#", "!"))
        ]
    lines += [("-X", pair) for pair in pairs]
    settings: dict[str, object] = dict(base or {})
    for source, line in lines:
        # A file as Java reads one (Connect workers' files use ':' and blanks too); -X as KEY=VALUE.
        found = (_PAIR if source == "-X" else _PROPERTY).fullmatch(line)
        if not found:  # named by its key alone: the rest may be a password
            raise error("RELAY_KAFKA_SETTING_MALFORMED", source=source, key=_KEY.match(line)[0])  # type: ignore[index]
        settings[found["key"]] = found["value"].strip()
    return settings


_KEY = re.compile(r"\s*[^=:\s]*")
_PAIR = re.compile(r"\s*(?P<key>[^=\s]+)\s*=(?P<value>.*)")
_PROPERTY = re.compile(r"\s*(?P<key>[^=:\s]+)(?:\s*[=:]|\s+)(?P<value>.*)")


def redacted(settings: dict[str, object]) -> dict[str, object]:
    return {k: ("***" if any(w in k for w in _SECRET_WORDS) else v) for k, v in settings.items()}


def cmd_relay(args: argparse.Namespace) -> int:
    """The daemon; `args.pause`, when a fault test's job injects one, holds it at named points."""
    from_file = _with_config_file(args)
    configure(args.log_format, logging.DEBUG if args.verbose else logging.INFO)
    if not args.name:
        raise error("RELAY_NAME_REQUIRED")
    kafka = kafka_settings(args.kafka, args.kafka_config, {**from_file, **secrets.kafka_secrets()})
    settings = RelaySettings(
        url=database_url(args.url),
        bootstrap=bootstrap_servers(args.bootstrap_servers),
        name=args.name,
        shard=args.shard,
        schema=schema_name(args.schema),
        batch_size=args.batch_size,
        batch_bytes=args.batch_bytes,
        poll_interval=args.poll_interval,
        on_poison=args.on_poison,
        topic_wait=args.topic_wait,
        positions_topic=args.positions_topic,
        cleanup=not args.no_cleanup,
        retention=args.retention,
        kafka=kafka,
        exactly_once=args.delivery == EXACTLY_ONCE,
        max_retries=args.max_retries,
        synchronous_commit=args.synchronous_commit,
        kafka_timeout=args.kafka_timeout,
        database_timeout=args.database_timeout,
        stop_timeout=args.stop_timeout,
        event_id_header=args.event_id_header,
    )
    # Set by SIGTERM or SIGINT, also one that came while the relay was still starting.
    stop = STOP
    catch_stop_signals()
    bound_stop(settings.stop_timeout)
    metrics = RelayMetrics(settings.name, str(settings.shard))
    server = None
    if args.metrics_address != "off":
        server = serve(metrics, args.metrics_address, wedged_after=settings.silence)
        host, port = cast(tuple[str, int], server.server_address[:2])
        log.info("serving /metrics, /livez and /readyz", extra={"url": f"http://{host}:{port}"})
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
    except OutboxError as exc:  # main prints it as text; JSON log pipelines read only JSON lines
        if args.log_format == "json":
            context = {"relay": settings.name, "shard": str(settings.shard)}
            log.critical("exiting on error", extra={**context, "code": exc.code, "error": exc.message})
        raise
    finally:
        if server is not None:
            server.shutdown()
    log.info("exiting", extra={"relay": settings.name, "shard": str(settings.shard)})
    return 0
