"""The relay's settings, each declared once (outbox.core.settings.Setting).

`outbox relay`'s flags and their environment variables, the defaults and checks
of :class:`RelaySettings`, docs/relay.md's table and the compose file's
variables all come from `SETTINGS` (tests check the last two against it).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.core import tables
from outbox.core.config import DatabaseUrl, schema_name
from outbox.core.settings import Setting, boolean, check_all
from outbox.errors import error
from outbox.relay.outbox_table import SYNCHRONOUS_COMMIT
from outbox.relay.poison import DEAD_LETTER, HALT
from outbox.relay.position import Shard

POSITIONS_TOPIC = "outbox-relay-positions"
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"

NAME: Setting[str | None] = Setting(
    "--name", None, "relay name: its position and transactional.id derive from it", str, "OUTBOX_RELAY_NAME"
)
SHARD = Setting(
    "--shard", Shard(), "I/N: publish only keys hashing to shard I of N", Shard.parse, "OUTBOX_RELAY_SHARD"
)
BATCH_SIZE = Setting(
    "--batch-size", 5000, "rows per Kafka transaction at most", int, "OUTBOX_RELAY_BATCH_SIZE", positive=True
)
BATCH_BYTES = Setting(
    "--batch-bytes",
    32 * 2**20,
    "bytes of keys and values that end a Kafka transaction, with the row that reaches them, so"
    " that a backlog of large rows is held a part at a time",
    int,
    "OUTBOX_RELAY_BATCH_BYTES",
    positive=True,
)
POLL_INTERVAL = Setting(
    "--poll-interval",
    1.0,
    "seconds between reads when no NOTIFY arrives",
    float,
    "OUTBOX_RELAY_POLL_INTERVAL",
    positive=True,
)
ON_POISON = Setting(
    "--on-poison",
    HALT,
    "a row Kafka refuses for good: halt (keep order, alert)"
    " or dead-letter (copy to relay_dead_letters, go on)",
    str,
    "OUTBOX_RELAY_ON_POISON",
    choices=(HALT, DEAD_LETTER),
)
TOPIC_WAIT = Setting(
    "--topic-wait",
    300.0,
    "with --on-poison dead-letter: seconds a row whose topic is missing or not writable is waited"
    " for (the topic made, the ACL granted) before it is dead-lettered",
    float,
    "OUTBOX_RELAY_TOPIC_WAIT",
    limits=(0.0, 1e9),
)
POSITIONS = Setting(
    "--positions-topic",
    POSITIONS_TOPIC,
    "compacted topic for relay positions (created if missing)",
    str,
    "OUTBOX_RELAY_POSITIONS_TOPIC",
)
RETENTION = Setting(
    "--retention",
    0.0,
    "keep published rows this many seconds before deleting them (at most 1e9, 31 years;"
    " --no-cleanup keeps them for good)",
    float,
    "OUTBOX_RELAY_RETENTION",
    limits=(0.0, 1e9),  # past ~6,000 years the cutoff is before year 1, and every cleanup failed
)
NO_CLEANUP = Setting("--no-cleanup", False, "never delete published rows", boolean, "OUTBOX_RELAY_NO_CLEANUP")
DELIVERY = Setting(
    "--delivery",
    EXACTLY_ONCE,
    "at-least-once: no Kafka transactions (for brokers without them; may duplicate on failure)",
    str,
    "OUTBOX_RELAY_DELIVERY",
    choices=(EXACTLY_ONCE, AT_LEAST_ONCE),
)
KAFKA_CONFIG: Setting[Path | None] = Setting(
    "--kafka-config",
    None,
    "file of KEY=VALUE librdkafka settings, keeps secrets out of argv",
    Path,
    "OUTBOX_RELAY_KAFKA_CONFIG",
)
CONFIG: Setting[Path | None] = Setting(
    "--config",
    None,
    "TOML file of these settings (the flags' names without --, and url, bootstrap-servers, schema;"
    " a [kafka] table of librdkafka's); flags and variables win over it",
    Path,
    "OUTBOX_RELAY_CONFIG",
)
METRICS_ADDRESS = Setting(
    "--metrics-address",
    "0.0.0.0:9400",
    "HOST:PORT for /metrics, /livez and /readyz, or off",
    str,
    "OUTBOX_RELAY_METRICS_ADDRESS",
)
KAFKA_TIMEOUT = Setting(
    "--kafka-timeout",
    30.0,
    "seconds a transactional call (init, commit, abort) waits for Kafka before it counts as timed"
    " out; a commit then is asked again for twice as long before a new producer settles it",
    float,
    "OUTBOX_RELAY_KAFKA_TIMEOUT",
    positive=True,
)
DATABASE_TIMEOUT = Setting(
    "--database-timeout",
    30.0,
    "seconds a PostgreSQL round trip may take before the relay drops the connection and starts over"
    " (a partition leaves it open, unanswered); the server's statement_timeout and keepalives follow it",
    float,
    "OUTBOX_RELAY_DATABASE_TIMEOUT",
    positive=True,
)
STOP_TIMEOUT = Setting(
    "--stop-timeout",
    25.0,
    "seconds a stop (SIGTERM, SIGINT) waits for the batch in flight before the relay exits with it"
    " open, which the next relay's producer aborts; a second signal exits at once. Keep it under"
    " the orchestrator's grace period (Kubernetes: 30 s)",
    float,
    "OUTBOX_RELAY_STOP_TIMEOUT",
    positive=True,
)
MAX_RETRIES = Setting(
    "--max-retries",
    10,
    "failed sessions in a row before exiting (backoff 0.5 s doubling to 30 s)",
    int,
    "OUTBOX_RELAY_MAX_RETRIES",
    limits=(0, 1e9),  # -1 exited at the first failure, where Kafka Connect's -1 retries for ever
)
SYNCHRONOUS = Setting(
    "--synchronous-commit",
    "on",
    "how durable a delta's mark must be before its Kafka commit: local (this server's disk),"
    " on (and the synchronous standbys', if the server names any), remote_write, remote_apply",
    str,
    "OUTBOX_RELAY_SYNCHRONOUS_COMMIT",
    choices=SYNCHRONOUS_COMMIT,
)
EVENT_ID_HEADER = Setting(
    "--event-id-header",
    tables.EVENT_ID_HEADER,
    "the header each record carries its event's id in (`id` for an outbox adopted from Debezium's,"
    " as its EventRouter names it); `outbox verify --id-header` reads the same",
    str,
    "OUTBOX_RELAY_EVENT_ID_HEADER",
)
LOG_FORMAT = Setting(
    "--log-format",
    "json",
    "log lines as JSON objects or text",
    str,
    "OUTBOX_LOG_FORMAT",
    choices=("json", "text"),
)

SETTINGS: tuple[Setting[Any], ...] = (
    NAME,
    SHARD,
    BATCH_SIZE,
    BATCH_BYTES,
    POLL_INTERVAL,
    ON_POISON,
    TOPIC_WAIT,
    POSITIONS,
    RETENTION,
    NO_CLEANUP,
    DELIVERY,
    KAFKA_CONFIG,
    CONFIG,
    METRICS_ADDRESS,
    KAFKA_TIMEOUT,
    DATABASE_TIMEOUT,
    STOP_TIMEOUT,
    MAX_RETRIES,
    SYNCHRONOUS,
    EVENT_ID_HEADER,
    LOG_FORMAT,
)


@dataclass(frozen=True)
class RelaySettings:
    """What one relay process does; the defaults and checks are the declarations' above."""

    url: DatabaseUrl
    bootstrap: str
    name: str
    shard: Shard = SHARD.default
    schema: str = ""  # given, else OUTBOX_SCHEMA, else public
    batch_size: int = BATCH_SIZE.default
    batch_bytes: int = BATCH_BYTES.default
    poll_interval: float = POLL_INTERVAL.default
    on_poison: str = ON_POISON.default
    topic_wait: float = TOPIC_WAIT.default
    positions_topic: str = POSITIONS.default
    cleanup: bool = True
    retention: float = RETENTION.default
    cleanup_batch: int = 10000
    kafka: Mapping[str, object] = field(default_factory=dict)
    exactly_once: bool = True
    max_retries: int = MAX_RETRIES.default
    synchronous_commit: str = SYNCHRONOUS.default
    kafka_timeout: float = KAFKA_TIMEOUT.default
    database_timeout: float = DATABASE_TIMEOUT.default
    stop_timeout: float = STOP_TIMEOUT.default
    event_id_header: str = EVENT_ID_HEADER.default

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", relay_name(self.name))
        object.__setattr__(self, "schema", schema_name(self.schema))
        check_all(SETTINGS, self)

    @property
    def silence(self) -> float:
        """How long the server lets the relay's session go unheard before it ends it, and frees the
        lock for a standby: longer than a healthy active relay ever goes without a query. Its
        longest silences are a batch's Kafka calls (a commit asked again for 2x the Kafka timeout)
        and a producer's start, between the lock and the mark (a topic list, init_transactions
        asked again for 2x, the position read: up to 5x); and a standby's poll interval."""
        return self.database_timeout + 5 * self.kafka_timeout + self.poll_interval

    @property
    def halt_wait(self) -> float:
        """How long a relay halted on a poison row waits, its session quiet, before it tries the row
        again: 30 s, or half the server's `silence` where that is shorter (short timeouts), for a
        session the server ended counted as a failure, and enough of them ended the relay."""
        return min(30.0, self.silence / 2)


def relay_name(name: str) -> str:
    """The name in NFC, so that names which look the same are one relay; or ConfigError.

    The name keys the relay's position, transactional.id and lock: two spellings
    of one name would be two relays, each publishing the outbox from its start.
    """
    control = any(unicodedata.category(c) in ("Cc", "Cs") for c in name)
    if not name or name != name.strip() or "/" in name or control:
        raise error("RELAY_NAME_INVALID", name=name)
    return unicodedata.normalize("NFC", name)
