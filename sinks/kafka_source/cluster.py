"""What the driver asks the cluster: which partitions exist and their offsets.

Latest offsets are asked for with read_committed isolation, so the broker
answers with the Last Stable Offset: a batch never ends inside a transaction
that is still open.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

from core.errors import ConfigError, ServiceUnavailable
from core.kafka import client_settings
from sinks.kafka_source.options import SourceOptions
from sinks.kafka_source.ranges import TopicPartitionKey


class Cluster:
    def __init__(self, options: SourceOptions, timeout: float = 30.0) -> None:
        self.options = options
        self.timeout = timeout
        self.admin = AdminClient(client_settings(options.consumer_config(), "admin"))

    def partitions(self) -> list[TopicPartitionKey]:
        """Partitions of the subscribed topics; a named topic that is missing is an error."""
        metadata = self._metadata()
        found = [
            (name, pid)
            for name, topic in metadata.topics.items()
            if self.options.matches(name) and topic.error is None
            for pid in topic.partitions
        ]
        missing = sorted(set(self.options.topics) - {name for name, _ in found})
        if missing:
            raise ConfigError(
                f"topic(s) {', '.join(missing)} do not exist on {self.options.bootstrap_servers}"
                " (deleted, or never created)"
            )
        return sorted(found)

    def topics(self) -> set[str]:
        """Every topic on the cluster, subscribed or not."""
        return set(self._metadata().topics)

    def _metadata(self):  # type: ignore[no-untyped-def]
        try:
            return self.admin.list_topics(timeout=self.timeout)
        except KafkaException as exc:
            raise ServiceUnavailable(
                f"cannot reach Kafka at {self.options.bootstrap_servers}: {exc.args[0].str()}"
            ) from None

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Kafka's id of each topic that exists: a topic created again under its name has another."""
        names = sorted(set(topics))
        if not names:
            return {}
        deadline = time.monotonic() + self.timeout
        while True:
            futures = self.admin.describe_topics(TopicCollection(names), request_timeout=self.timeout)
            ids: dict[str, str] = {}
            try:
                for name, future in futures.items():
                    try:
                        ids[name] = str(future.result().topic_id)
                    except KafkaException as exc:
                        if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                            raise
                return ids
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or time.monotonic() > deadline:
                    where = self.options.bootstrap_servers
                    raise ServiceUnavailable(f"cannot describe topics on {where}: {error.str()}") from None
            time.sleep(0.2)

    def earliest(self, partitions: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        return self._list_offsets(partitions, OffsetSpec.earliest())

    def latest(self, partitions: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        return self._list_offsets(partitions, OffsetSpec.latest())

    def high_watermarks(self, partitions: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The ends of the logs, open transactions' records included."""
        return self._list_offsets(partitions, OffsetSpec.latest(), uncommitted=True)

    def max_transaction_timeout(self, default: float = 900.0) -> float:
        """Seconds the brokers let a transaction live (transaction.max.timeout.ms); `default` if unsaid."""
        try:
            broker = str(next(iter(self._metadata().brokers)))
            resource = ConfigResource(ConfigResource.Type.BROKER, broker)
            entry = self.admin.describe_configs([resource])[resource].result(self.timeout)
            return int(entry["transaction.max.timeout.ms"].value) / 1000
        except (KafkaException, KeyError, StopIteration, ValueError, TypeError):
            return default

    def _list_offsets(
        self, partitions: Iterable[TopicPartitionKey], spec: OffsetSpec, *, uncommitted: bool = False
    ) -> dict[TopicPartitionKey, int]:
        wanted = {TopicPartition(t, p): spec for t, p in partitions}
        if not wanted:
            return {}
        isolation = (
            IsolationLevel.READ_UNCOMMITTED
            if self.options.read_uncommitted or uncommitted
            else IsolationLevel.READ_COMMITTED
        )
        deadline = time.monotonic() + self.timeout
        while True:
            futures = self.admin.list_offsets(wanted, isolation_level=isolation, request_timeout=self.timeout)
            try:
                return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            except KafkaException as exc:
                error = exc.args[0]
                if not transient(error) or time.monotonic() > deadline:
                    raise ServiceUnavailable(
                        f"cannot list offsets on {self.options.bootstrap_servers}: {error.str()}"
                    ) from None
            time.sleep(0.2)


# A partition just added, or whose leader just moved, answers with these for a moment.
_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def transient(error: KafkaError) -> bool:
    """Whether an error listing offsets passes by itself (then ask again, up to the timeout)."""
    return error.retriable() or error.code() in _TRANSIENT
