"""Source options, parsed and checked once, on the driver, before any task runs."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from outbox._core.config import database_url, schema_name
from sinks.errors import error
from sinks.ledger import Ledger

READ_UNCOMMITTED_OPT_IN = "unsafe.readUncommitted"

# Options Spark's kafka source accepts that make no sense here.
_REJECTED = {
    "kafka.group.id": "offsets are tracked in the checkpoint, not in a consumer group",
    "kafka.enable.auto.commit": "offsets are tracked in the checkpoint, not in a consumer group",
    "assign": "use subscribe or subscribePattern",
}
_OURS = {
    "subscribe",
    "subscribepattern",
    "startingoffsets",
    "endingoffsets",
    "maxoffsetspertrigger",
    "failondataloss",
    "polltimeoutms",
    "minpartitions",
    "stallwarnms",
    "unavailabletimeoutms",
    "ledger.sink",
    "ledger.url",
    "ledger.schema",
    READ_UNCOMMITTED_OPT_IN.lower(),
}

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: str | dict[str, dict[str, int]] = "earliest"
    ending: str | dict[str, dict[str, int]] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    poll_timeout_s: float = 120.0
    read_uncommitted: bool = False
    min_partitions: int | None = None
    # Warn when a partition's LSO stands behind its high watermark this long (None: the broker's limit).
    stall_warn_s: float | None = None
    # How long the driver waits for Kafka to answer (None: in a stream for ever, in a batch query 30 s).
    unavailable_timeout_s: float | None = None
    # Start from the exactly-once sink's ledger instead of startingOffsets.
    ledger: Ledger | None = None
    kafka: dict[str, str] = field(default_factory=dict)

    def consumer_config(self) -> dict[str, object]:
        """librdkafka settings for a reader: no group commits, our isolation level."""
        return {
            **self.kafka,
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.kafka.get("group.id", "outbox-spark-source"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            "isolation.level": "read_uncommitted" if self.read_uncommitted else "read_committed",
        }

    @property
    def subscription(self) -> str:
        """As the user wrote it, for messages."""
        return (
            f"subscribePattern {self.pattern}"
            if self.pattern is not None
            else f"subscribe {','.join(self.topics)}"
        )

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics


def parse(options: Mapping[str, str]) -> SourceOptions:
    opts = {k.lower(): v for k, v in options.items()}
    kafka = {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    for key, why in _REJECTED.items():
        if key in opts:
            raise error("KAFKA_RC_OPTION_UNSUPPORTED", option=key, why=why)
    unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in _OURS and k != "path")
    if unknown:
        raise error("KAFKA_RC_OPTION_UNKNOWN", options=", ".join(unknown))
    bootstrap = kafka.pop("bootstrap.servers", None)
    if not bootstrap:
        raise error("KAFKA_RC_BOOTSTRAP_MISSING")
    if "isolation.level" in kafka:
        raise error("KAFKA_RC_ISOLATION_LEVEL_SET", opt_in=READ_UNCOMMITTED_OPT_IN)
    subscribe, pattern = opts.get("subscribe"), opts.get("subscribepattern")
    if bool(subscribe) == bool(pattern):
        raise error("KAFKA_RC_SUBSCRIPTION_NOT_ONE")
    topics = tuple(t.strip() for t in (subscribe or "").split(",") if t.strip())
    if subscribe is not None and not topics:
        raise error("KAFKA_RC_SUBSCRIBE_EMPTY")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise error("KAFKA_RC_PATTERN_INVALID", reason=exc) from None
    max_per_trigger = opts.get("maxoffsetspertrigger")
    if ("ledger.url" in opts or "ledger.schema" in opts) and not opts.get("ledger.sink"):
        raise error("KAFKA_RC_LEDGER_SINK_MISSING")
    ledger = None
    if opts.get("ledger.sink"):
        url = database_url(opts.get("ledger.url"))
        ledger = Ledger(url, schema_name(opts.get("ledger.schema")), opts["ledger.sink"])
    return SourceOptions(
        bootstrap_servers=bootstrap,
        topics=topics,
        pattern=pattern,
        starting=_offsets_option("startingOffsets", opts.get("startingoffsets", "earliest")),
        ending=_offsets_option("endingOffsets", opts.get("endingoffsets", "latest")),
        max_offsets_per_trigger=_positive_int("maxOffsetsPerTrigger", max_per_trigger),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        poll_timeout_s=(_positive_int("pollTimeoutMs", opts.get("polltimeoutms")) or 120_000) / 1000,
        read_uncommitted=_bool(READ_UNCOMMITTED_OPT_IN, opts.get(READ_UNCOMMITTED_OPT_IN.lower(), "false")),
        min_partitions=_positive_int("minPartitions", opts.get("minpartitions")),
        stall_warn_s=_seconds("stallWarnMs", opts.get("stallwarnms")),
        unavailable_timeout_s=_seconds("unavailableTimeoutMs", opts.get("unavailabletimeoutms")),
        ledger=ledger,
        kafka=kafka,
    )


def _offsets_option(name: str, value: str) -> str | dict[str, dict[str, int]]:
    value = value.strip()
    if value in ("earliest", "latest"):
        return value
    try:
        parsed = json.loads(value)
        return {
            str(topic): {str(int(p)): int(o) for p, o in parts.items()} for topic, parts in parsed.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise error("KAFKA_RC_OFFSETS_INVALID", option=name, value=value) from None


def _positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise error("KAFKA_RC_OPTION_NOT_POSITIVE", option=name, value=value)
    return number


def _seconds(name: str, millis: str | None) -> float | None:
    number = _positive_int(name, millis)
    return number / 1000 if number else None


def _bool(name: str, value: str) -> bool:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise error("KAFKA_RC_OPTION_NOT_BOOLEAN", option=name, value=value)
