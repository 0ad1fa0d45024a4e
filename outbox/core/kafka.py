"""Kafka client settings per role, from the one settings map a user gives.

A user passes one map (`-X key=value`, `kafka.*` options) and the framework
builds producers, consumers and admin clients from it. librdkafka warns
about, or refuses, keys that belong to another role, so each client gets
the shared keys (security, client.id, ...) and its own role's.

librdkafka also reports every failed connection attempt, dozens a second.
Its log goes to the `outbox.kafka` logger only once a level is set on that
logger (the CLI's --verbose, or the application's own logging setup): the
library sets no level of its own on any logger. What matters of it reaches
the user in the error of the call that failed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import KafkaError

Role = Literal["producer", "consumer", "admin"]

CLIENT_LOG = "outbox.kafka"
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def topic_name_valid(name: object) -> bool:
    """Kafka's own rule for a topic's name (org.apache.kafka.common.internals.Topic)."""
    return isinstance(name, str) and _TOPIC_NAME.fullmatch(name) is not None and name not in (".", "..")


class ClientLog:
    """What librdkafka is given as its logger: its lines pass to `outbox.kafka` only where a level
    was set on that logger, so a root logger at DEBUG alone does not bring the flood."""

    def log(self, level: int, msg: str, *args: object) -> None:
        target = logging.getLogger(CLIENT_LOG)
        if target.level != logging.NOTSET and target.isEnabledFor(level):
            target.log(level, msg, *args)


_log = ClientLog()

# Keys (or key prefixes) that only one role takes (librdkafka's CONFIGURATION.md, column C/P);
# the general ("*") ones, message.max.bytes and retry.backoff.ms among them, go to every client.
_PRODUCER_ONLY = (
    "partitioner",
    "linger.ms",
    "queue.buffering.max",
    "batch.",
    "compression",
    "acks",
    "transaction",
    "enable.idempotence",
    "message.timeout.ms",
    "retries",
    "delivery.timeout.ms",
    "request.required.acks",
    "sticky.partitioning",
    "delivery.report",
)
_CONSUMER_ONLY = (
    "group.",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "isolation.level",
    "auto.offset.reset",
    "auto.commit",
    "fetch.",
    "max.partition.fetch.bytes",
    "queued.",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
)
_NOT_FOR: dict[Role, tuple[str, ...]] = {
    "producer": _CONSUMER_ONLY,
    "consumer": _PRODUCER_ONLY,
    "admin": _PRODUCER_ONLY + _CONSUMER_ONLY,
}


def client_settings(
    settings: Mapping[str, object], role: Role, *, bootstrap: str | None = None
) -> dict[str, Any]:
    """`settings` less the other roles' keys, with `bootstrap` if given and the quiet log."""
    kept = {k: v for k, v in settings.items() if not k.startswith(_NOT_FOR[role]) and k != "logger"}
    if bootstrap is not None:
        kept["bootstrap.servers"] = bootstrap
    return {**kept, "logger": _log}


def about_the_group(failure: KafkaError) -> bool:
    """Whether a consumer's error is of the consumer group librdkafka looks up for any consumer with a
    group.id, even one that only assigns partitions and never commits, as every reader here does. On
    a cluster that authorises by ACLs, a principal with no grant on that group gets
    GROUP_AUTHORIZATION_FAILED as each consumer starts, which says nothing about the read (Java's
    consumer, which the same reads need no group grant for, never asks)."""
    return failure.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
