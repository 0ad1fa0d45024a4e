"""Source options, each declared once, parsed and checked on the driver before any task runs.

The declarations (outbox.core.settings.Setting) give each option's name, default,
doc, parser and checks; `parse` reads them, and docs/source.md's options table is
checked against them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.core.config import database_url, schema_name
from outbox.core.settings import Setting, boolean
from sinks.errors import error
from sinks.ledger import Ledger

Offsets = str | dict[str, dict[str, int]]
EARLIEST = -2
LATEST = -1


ENDING_NAME = "endingOffsets"
# Kafka's own (org.apache.kafka.common.internals.Topic): a pattern never reads them, as Kafka's own
# consumers leave them out (exclude.internal.topics); named in subscribe, they are read.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


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
    ENDING_NAME,
    "latest",
    "where a batch query ends (never past the last stable offset): latest or JSON",
    _offsets(ENDING_NAME),
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
    "kafka.auto.offset.reset": "the source starts where startingOffsets or its checkpoint says",
    "kafka.enable.partition.eof": "the source sets it itself",
    "kafka.enable.auto.offset.store": "offsets are tracked in the checkpoint, not in a consumer group",
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
            return topic not in INTERNAL_TOPICS and re.fullmatch(self.pattern, topic) is not None
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
    if (subscribe is None) == (pattern is None):  # an empty one given is given: it won, and read nothing
        raise error("KAFKA_RC_SUBSCRIPTION_NOT_ONE")
    if pattern is not None and not pattern.strip():
        raise error("KAFKA_RC_PATTERN_INVALID", reason="it is empty")
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
    parsed = SourceOptions(
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
    for option, offsets in ((STARTING.name, parsed.starting), (ENDING.name, parsed.ending)):
        unread = sorted(t for t in offsets if not parsed.matches(t)) if isinstance(offsets, dict) else []
        if unread:
            raise error(
                "KAFKA_RC_OFFSETS_TOPIC_NOT_READ",
                option=option,
                topics=unread,
                subscription=parsed.subscription,
            )
    return parsed


class _Object(list[tuple[str, Any]]):
    """A JSON object's members in order, repeats kept (json's hook), to refuse a repeat."""


def _offsets_option(name: str, value: str) -> Offsets:
    """Spark's forms, read strictly: what Python would bend (1.9 as 1, true as 1, a partition given
    twice, the last one winning) is refused, as is a position no offset means."""
    text = value.strip()
    ending = name == ENDING_NAME

    def invalid(why: str) -> Exception:
        return error("KAFKA_RC_OFFSETS_INVALID", option=name, why=why, value=text[:200])

    if text.lower() in ("earliest", "latest"):
        if ending and text.lower() == "earliest":
            raise invalid("a query does not end at the earliest offsets")
        return text.lower()
    try:
        topics = json.loads(text, object_pairs_hook=_Object)
    except (ValueError, RecursionError):
        raise invalid("this is neither a keyword nor JSON") from None
    if not isinstance(topics, _Object):
        raise invalid("the JSON is no object of topics")
    lowest = LATEST if ending else EARLIEST
    offsets: dict[str, dict[str, int]] = {}
    for topic, partitions in topics:
        if topic in offsets:
            raise invalid(f"topic {topic!r} is given twice")
        if not isinstance(partitions, _Object):
            raise invalid(f"topic {topic!r} needs an object of partitions")
        offsets[topic] = {}
        for partition, offset in partitions:
            number = partition.strip()
            if not number.isdigit():
                raise invalid(f"partition {partition!r} of {topic!r} is no partition number")
            if str(int(number)) in offsets[topic]:
                raise invalid(f"partition {int(number)} of {topic!r} is given twice")
            if type(offset) is not int or offset < lowest:
                raise invalid(
                    f"the offset {json.dumps(offset)} of {topic}-{int(number)} is no offset"
                    f" ({'-1 latest' if ending else '-2 earliest, -1 latest'}, or 0 and up)"
                )
            offsets[topic][str(int(number))] = offset
    return offsets
