"""Source options, each declared once, parsed and checked on the driver before any task runs.

The declarations (outbox._core.settings.Setting) give each option's name, default,
doc, parser and checks; `parse` reads them, and docs/source.md's options table is
checked against them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox._core.config import database_url, schema_name
from outbox._core.settings import Setting, boolean
from sinks.errors import error
from sinks.ledger import Ledger

Offsets = str | dict[str, dict[str, int]]
EARLIEST = -2
LATEST = -1


def _offsets(name: str) -> Callable[[str], Offsets]:
    return lambda text: _offsets_option(name, text)


SUBSCRIBE: Setting[str | None] = Setting("subscribe", None, "the topics to read, comma-separated", str)
SUBSCRIBE_PATTERN: Setting[str | None] = Setting(
    "subscribePattern", None, "or a regular expression the names of the topics to read match in full", str
)
STARTING: Setting[Offsets] = Setting(
    "startingOffsets",
    "earliest",
    'where a query without a checkpoint starts: earliest, latest or JSON {"topic":{"0":23}}',
    _offsets("startingOffsets"),
)
ENDING: Setting[Offsets] = Setting(
    "endingOffsets",
    "latest",
    "where a batch query ends (never past the last stable offset): latest or JSON",
    _offsets("endingOffsets"),
)
MAX_OFFSETS_PER_TRIGGER: Setting[int | None] = Setting(
    "maxOffsetsPerTrigger", None, "records per micro-batch at most, over all partitions", int, positive=True
)
FAIL_ON_DATA_LOSS = Setting(
    "failOnDataLoss",
    True,
    "stop when offsets the query needs are gone (retention, a deleted or recreated topic)",
    boolean,
)
POLL_TIMEOUT_MS = Setting(
    "pollTimeoutMs",
    120_000,
    "how long a batch query's task waits without progress before failing",
    int,
    positive=True,
)
MIN_PARTITIONS: Setting[int | None] = Setting(
    "minPartitions", None, "cut large ranges so that a batch has at least this many tasks", int, positive=True
)
MIN_RECORDS_PER_TASK = Setting(
    "minRecordsPerTask",
    10_000,
    "ranges smaller than this are read together, each whole, in tasks of about this many records:"
    " a micro-batch of many small partitions is a few tasks, not one per partition (1: one each)",
    int,
    positive=True,
)
STALL_WARN_MS: Setting[int | None] = Setting(
    "stallWarnMs",
    None,
    "warn when a partition's last stable offset stands behind its end this long"
    " (default: the broker's transaction.max.timeout.ms)",
    int,
    positive=True,
)
UNAVAILABLE_TIMEOUT_MS: Setting[int | None] = Setting(
    "unavailableTimeoutMs",
    None,
    "how long the driver and a stream's tasks wait for a Kafka that does not answer"
    " (default: a stream for ever, a batch query 30 s)",
    int,
    positive=True,
)
LEDGER_SINK: Setting[str | None] = Setting(
    "ledger.sink", None, "start from this exactly-once sink's ledger instead of startingOffsets", str
)
LEDGER_URL: Setting[str | None] = Setting(
    "ledger.url", None, "the ledger's PostgreSQL (default: DATABASE_URL)", str
)
LEDGER_SCHEMA: Setting[str | None] = Setting(
    "ledger.schema", None, "the ledger's schema (default: OUTBOX_SCHEMA, or public)", str
)
READ_UNCOMMITTED = Setting(
    "unsafe.readUncommitted",
    False,
    "read records of open and aborted transactions too: breaks exactly-once",
    boolean,
)
OPTIONS: tuple[Setting[Any], ...] = (
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    STARTING,
    ENDING,
    MAX_OFFSETS_PER_TRIGGER,
    FAIL_ON_DATA_LOSS,
    POLL_TIMEOUT_MS,
    MIN_PARTITIONS,
    MIN_RECORDS_PER_TASK,
    STALL_WARN_MS,
    UNAVAILABLE_TIMEOUT_MS,
    LEDGER_SINK,
    LEDGER_URL,
    LEDGER_SCHEMA,
    READ_UNCOMMITTED,
)

# Options Spark's kafka source accepts that make no sense here.
_REJECTED = {
    "kafka.group.id": "offsets are tracked in the checkpoint, not in a consumer group",
    "kafka.enable.auto.commit": "offsets are tracked in the checkpoint, not in a consumer group",
    "assign": "use subscribe or subscribePattern",
}


def _seconds(millis: int | None) -> float | None:
    return millis / 1000 if millis is not None else None


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: Offsets = STARTING.default
    ending: Offsets = ENDING.default
    max_offsets_per_trigger: int | None = MAX_OFFSETS_PER_TRIGGER.default
    fail_on_data_loss: bool = FAIL_ON_DATA_LOSS.default
    poll_timeout_s: float = POLL_TIMEOUT_MS.default / 1000
    read_uncommitted: bool = READ_UNCOMMITTED.default
    min_partitions: int | None = MIN_PARTITIONS.default
    min_records_per_task: int = MIN_RECORDS_PER_TASK.default
    # Warn when a partition's LSO stands behind its high watermark this long (None: the broker's limit).
    stall_warn_s: float | None = _seconds(STALL_WARN_MS.default)
    # How long the driver waits for Kafka to answer (None: in a stream for ever, in a batch query 30 s).
    unavailable_timeout_s: float | None = _seconds(UNAVAILABLE_TIMEOUT_MS.default)
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
    ours = {o.name.lower() for o in OPTIONS}
    unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in ours and k != "path")
    if unknown:
        raise error("KAFKA_RC_OPTION_UNKNOWN", options=", ".join(unknown))

    def read(option: Setting[Any]) -> Any:
        return option.read(opts.get(option.name.lower()))

    bootstrap = kafka.pop("bootstrap.servers", None)
    if not bootstrap:
        raise error("KAFKA_RC_BOOTSTRAP_MISSING")
    if "isolation.level" in kafka:
        raise error("KAFKA_RC_ISOLATION_LEVEL_SET", opt_in=READ_UNCOMMITTED.name)
    subscribe, pattern = read(SUBSCRIBE), read(SUBSCRIBE_PATTERN)
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
    sink, url, schema = read(LEDGER_SINK), read(LEDGER_URL), read(LEDGER_SCHEMA)
    if (url is not None or schema is not None) and not sink:
        raise error("KAFKA_RC_LEDGER_SINK_MISSING")
    ledger = Ledger(database_url(url), schema_name(schema), sink) if sink else None
    return SourceOptions(
        bootstrap_servers=bootstrap,
        topics=topics,
        pattern=pattern,
        starting=read(STARTING),
        ending=read(ENDING),
        max_offsets_per_trigger=read(MAX_OFFSETS_PER_TRIGGER),
        fail_on_data_loss=read(FAIL_ON_DATA_LOSS),
        poll_timeout_s=read(POLL_TIMEOUT_MS) / 1000,
        read_uncommitted=read(READ_UNCOMMITTED),
        min_partitions=read(MIN_PARTITIONS),
        min_records_per_task=read(MIN_RECORDS_PER_TASK),
        stall_warn_s=_seconds(read(STALL_WARN_MS)),
        unavailable_timeout_s=_seconds(read(UNAVAILABLE_TIMEOUT_MS)),
        ledger=ledger,
        kafka=kafka,
    )


def _offsets_option(name: str, value: str) -> Offsets:
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
