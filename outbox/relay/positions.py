"""The relay's position store: a compacted topic, one record per relay, outbox and shard.

As Kafka Connect keeps its offset store apart from the task, this module only
reads the store and makes sure it exists; the Publisher writes each position
inside the transaction of the records it covers, and `position.latest_position`
decides which record is this relay's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from core.committed import read_committed
from core.errors import ConfigError
from core.kafka import client_settings
from outbox.relay.position import Identity, Position, latest_position

log = logging.getLogger("outbox.relay")


class PositionStore:
    def __init__(self, topic: str, settings: Mapping[str, object], bootstrap: str, timeout: float) -> None:
        self.topic, self.settings, self.bootstrap, self.timeout = topic, settings, bootstrap, timeout

    def latest(self, relay: Identity) -> Position | None:
        """This relay's last committed position (None: it never ran), creating the topic if need be."""
        self.ensure_topic()
        return latest_position(self.records(relay.name), relay)

    def ensure_topic(self) -> None:
        admin = AdminClient(client_settings(self.settings, "admin", bootstrap=self.bootstrap))
        if self.topic in admin.list_topics(timeout=self.timeout).topics:
            return
        topic = NewTopic(self.topic, 1, config={"cleanup.policy": "compact"})
        for future in admin.create_topics([topic]).values():
            try:
                future.result(self.timeout)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ConfigError(
                        f"cannot create the relay positions topic {self.topic!r}:"
                        f" {exc.args[0].str()} (create it yourself: compacted, 1 partition)"
                    ) from None
        log.info("created positions topic", extra={"topic": self.topic})

    def records(self, name: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every committed record of the topic, in order, up to its high watermark now
        (a position of ours may lie beyond another relay's still-open transaction)."""
        config = client_settings(
            {**self.settings, "group.id": f"outbox-relay-positions.{name}"},
            "consumer",
            bootstrap=self.bootstrap,
        )
        stuck = (
            f"the positions topic {self.topic!r} has a transaction open for over"
            f" {self.timeout * 4:.0f}s (another relay's, not yet timed out); retrying"
        )
        messages = read_committed(config, self.topic, timeout=self.timeout * 4, stuck=stuck)
        return [(m.key(), m.value()) for m in messages]
