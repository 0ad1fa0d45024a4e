"""Which Kafka errors are about one record (poison) and which are about the cluster (retry).

A poison record fails the same way every time it is sent, so retrying cannot
help and publishing past it would break order: the relay halts on it or,
when asked to, dead-letters it. Everything else is retried with backoff.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from outbox._core.errors import OutboxError

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
    """

    code = "RELAY_POISON"  # a class attribute, not a field: the constructor stays (row_id, reason, ambiguous)

    row_id: int
    reason: str
    ambiguous: bool = False

    # The base sets `message` in its __init__, which this dataclass's own __init__ replaces.
    @property
    def message(self) -> str:  # type: ignore[override]  # read-only here: the words follow the fields
        return f"outbox row {self.row_id}: {self.reason}"


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
        return f"not authorized to write to topic {topic!r} (grant WRITE, or fix the relay's credentials)"
    return f"Kafka refused the record for topic {topic!r}: {error.str()}"


def missing_topic(topic: str) -> str:
    return f"topic {topic!r} does not exist (create it; the relay never auto-creates topics)"
