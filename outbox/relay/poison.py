"""Which Kafka errors are about one record (poison) and which are about the cluster (retry).

A poison record fails the same way every time it is sent, so retrying cannot
help and publishing past it would break order: the relay halts on it or,
when asked to, dead-letters it. Everything else is retried with backoff.
Which row a refusal names is found here from what Kafka answered (`reported`);
kafka.py asks Kafka, and the relay's loop finds a row the broker would not name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from outbox.core.errors import OutboxError
from outbox.core.kafka import topic_name_valid
from outbox.core.tables import EVENT_ID_HEADER
from outbox.relay.row import Row

POISON_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError._INVALID_ARG,
    }
)

HALT = "halt"
DEAD_LETTER = "dead-letter"
POLICIES = (HALT, DEAD_LETTER)


SIZE_CODES = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE}
)


@dataclass(frozen=True)
class Poison(OutboxError):
    """Outbox row `row_id` cannot be published: `reason` says why and what to do.

    ambiguous: the broker refused a whole batch of records as too large, so it
    cannot say which one is: the rows are tried again one per transaction.
    topic: the row's topic is missing or not writable, not the record wrong: set
    right, the same record goes out (a dead-letter relay waits for it a while).
    """

    code = "RELAY_POISON"  # a class attribute, not a field: the constructor stays (row_id, reason, ...)

    row_id: int
    reason: str
    ambiguous: bool = False
    topic: bool = False

    # The base sets `message` in its __init__, which this dataclass's own __init__ replaces.
    @property
    def message(self) -> str:  # type: ignore[override]  # read-only here: the words follow the fields
        return f"outbox row {self.row_id}: {self.reason}"


TOPIC_CODES = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError.TOPIC_AUTHORIZATION_FAILED}
)


def is_poison(error: KafkaError) -> bool:
    return error.code() in POISON_CODES


def explain(error: KafkaError, topic: str, size: int) -> str:
    """The error in words a platform team can act on."""
    code = error.code()
    if code in SIZE_CODES:
        return (
            f"record of {size} bytes is larger than Kafka accepts for topic {topic!r}"
            " (raise the topic's max.message.bytes and the relay's -X message.max.bytes,"
            " or remove the row)"
        )
    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        return missing_topic(topic)
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return (
            f"not authorized to write to topic {topic!r}: grant the relay's principal Write on it"
            f" (kafka-acls --add --operation Write --topic {topic}), or fix the relay's credentials"
        )
    return f"Kafka refused the record for topic {topic!r}: {error.str()}"


def missing_topic(topic: str) -> str:
    return f"topic {topic!r} does not exist (create it; the relay never auto-creates topics)"


def unpublishable(
    rows: Sequence[Row], positions_topic: str, id_header: str = EVENT_ID_HEADER
) -> tuple[int, str] | None:
    """The first row that can never go out as written, and why; None when every row can. Rows
    written by hand (other languages INSERT them) can hold what add_event refuses; published, they
    would end the relay's process at every start, or go out other than they read. On the publishing
    path: headers are looked at only where a row has some, each topic once."""
    headed = [r for r in rows if r.header_keys or r.header_values]
    found = [(r.id, why) for r in headed if (why := _headers(r, id_header))]
    first: dict[str, int] = {}
    for r in rows:
        first.setdefault(r.topic, r.id)
    found += [(first[t], why) for t in first if (why := _topic(t, positions_topic))]
    return min(found) if found else None


def reported(failures: Sequence[tuple[KafkaError, Message]], rows: Sequence[Row]) -> Poison | None:
    """The first row Kafka refused for good, found by its topic, key and value; None when no
    delivery report (`failures`) names one of `rows`.

    Delivery reports carry no headers, so the event id cannot say; rows with
    equal content fail alike, and the lowest id is the one that blocks. The
    broker refuses a too large batch as a whole: when several rows share that
    answer, none of them is named (the Poison is ambiguous).
    """
    refused = []
    for failure, message in failures:
        if not is_poison(failure):
            continue
        sent = (message.topic(), message.key(), message.value())
        row = next((r for r in rows if (r.topic, r.key, r.value) == sent), None)
        if row is not None:
            refused.append((row.id, explain(failure, row.topic, record_size(row)), failure.code()))
    if not refused:
        return None
    row_id, reason, code = min(refused)
    too_large = {r for r, _, c in refused if c in SIZE_CODES}
    return Poison(
        row_id, reason, ambiguous=code in SIZE_CODES and len(too_large) > 1, topic=code in TOPIC_CODES
    )


def _headers(row: Row, id_header: str) -> str | None:
    names, values = row.header_keys or [], row.header_values or []
    if len(names) != len(values):
        return f"its header_keys and header_values differ in length ({len(names)} and {len(values)})"
    if any(not isinstance(n, str | None) for n in names) or any(
        not isinstance(v, bytes | None) for v in values
    ):
        return "header_keys and header_values must be one-dimensional arrays"
    if None in names:
        return "a header name is NULL"
    if id_header in names:
        return f"a header named {id_header!r}: the relay stamps every record with the event's id there"
    return None


def _topic(topic: str, positions_topic: str) -> str | None:
    if not topic_name_valid(topic):
        return f"topic {topic!r} is no name Kafka takes (ASCII letters, digits, '.', '_', '-'; at most 249)"
    if topic == positions_topic:
        return f"topic {topic!r} is the relay's own positions topic"
    return None


def record_size(row: Row) -> int:
    """The bytes of a row's record that count against Kafka's limits: key, value and headers (the
    relay's event id among them), not the value alone. For a row `unpublishable` passed."""
    headers = [
        (EVENT_ID_HEADER, row.event_id),
        *zip(row.header_keys or (), row.header_values or (), strict=True),
    ]
    named = sum(len(n.encode()) + len(v or b"") for n, v in headers)
    return len(row.key or b"") + len(row.value or b"") + named
