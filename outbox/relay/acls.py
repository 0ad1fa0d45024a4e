"""The Kafka ACLs a relay needs, declared once.

docs/relay.md's list, the line a relay refused by Kafka's authoriser stops
with, and the test that runs a relay with these grants and no others all come
from `grants`. Kafka's WRITE, READ and the like imply DESCRIBE, so it is not
listed where one of them is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError

from outbox.core.errors import OutboxError
from outbox.errors import error

TOPIC, TRANSACTIONAL_ID = "topic", "transactional-id"


@dataclass(frozen=True)
class Grant:
    """One `kafka-acls --add` for the relay's principal: operations on a resource."""

    resource: str  # TOPIC or TRANSACTIONAL_ID, as kafka-acls names them
    name: str  # the resource's name, or the prefix of its names
    operations: tuple[str, ...]  # Kafka's operation names: Write, Read, Create, DescribeConfigs...
    why: str
    prefixed: bool = False

    def command(self, bootstrap: str, principal: str) -> str:
        """The kafka-acls command line that adds this grant."""
        what = f"--{self.resource} {_quoted(self.name)}"
        operations = " ".join(f"--operation {o}" for o in self.operations)
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (
            f"kafka-acls --bootstrap-server {bootstrap} --add --allow-principal {_quoted(principal)}"
            f" {operations} {what}{pattern}"
        )


def grants(name: str, positions_topic: str, *, exactly_once: bool = True) -> list[Grant]:
    """What relay `name` needs, besides Write on each topic its outbox rows name (`events_topic`)."""
    needed = [positions(positions_topic), creating(positions_topic)]
    # At least once, the idempotent producer needs no more than Write on a topic (KIP-679).
    return [*needed, transactions(name)] if exactly_once else needed


def positions(topic: str) -> Grant:
    return Grant(
        TOPIC,
        topic,
        ("Read", "Write", "DescribeConfigs"),
        "on its positions topic, to read its position back at each start, write it in each batch's"
        " transaction and check the topic's settings",
    )


def creating(topic: str) -> Grant:
    return Grant(TOPIC, topic, ("Create",), "to make its positions topic (or make the topic yourself)")


def transactions(name: str) -> Grant:
    """Every transactional.id of relay `name` starts so (outbox.relay.position.Identity)."""
    return Grant(
        TRANSACTIONAL_ID,
        f"outbox-relay.{name}.",
        ("Write",),
        "for its transactions, one transactional.id per outbox and shard",
        prefixed=True,
    )


def events_topic(topic: str) -> Grant:
    return Grant(TOPIC, topic, ("Write",), "on each topic its outbox rows name, to publish their events")


@dataclass(frozen=True)
class Access:
    """Who relay `name` is to Kafka's authoriser: enough to say which grant a refusal asks for."""

    bootstrap: str
    name: str
    positions_topic: str
    principal: str  # User:NAME for SASL's PLAIN and SCRAM; a placeholder where Kafka derives it otherwise

    @classmethod
    def of(cls, bootstrap: str, name: str, positions_topic: str, settings: Mapping[str, object]) -> Access:
        user = settings.get("sasl.username")
        return cls(
            bootstrap, name, positions_topic, f"User:{user}" if user else "User:<the relay's principal>"
        )

    def grant(self, failure: KafkaError, *, create: bool = False) -> Grant | None:
        """The grant a refusal asks for (None: `failure` is no authorisation refusal). A topic refused
        outside a batch's records is the positions topic: an event's topic is refused per record, as
        a poison row (kafka.py, poison.py)."""
        code = failure.code()
        if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            return transactions(self.name)
        if create and code in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        ):
            return creating(self.positions_topic)
        if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return positions(self.positions_topic)
        return None

    def refused(self, failure: KafkaError, *, create: bool = False) -> OutboxError | None:
        """RELAY_KAFKA_NOT_AUTHORIZED with the kafka-acls command that adds the grant asked for."""
        grant = self.grant(failure, create=create)
        if grant is None:
            return None
        return error(
            "RELAY_KAFKA_NOT_AUTHORIZED",
            bootstrap=self.bootstrap,
            reason=failure.str(),
            why=grant.why,
            command=grant.command(self.bootstrap, self.principal),
        )


def _quoted(text: str) -> str:
    return text if all(c.isalnum() or c in "._-:" for c in text) else "'" + text.replace("'", "'\\''") + "'"
