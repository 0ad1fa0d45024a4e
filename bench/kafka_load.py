"""Making and loading a topic fast for the benchmarks (shared by the scripts beside it)."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.core.kafka import client_settings


def new_topic(bootstrap: str, name: str, partitions: int) -> None:
    """Create topic `name` of `partitions` partitions."""
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    # The broker's own replication: 1 on one broker, 3 on the dev cluster.
    for future in admin.create_topics([NewTopic(name, partitions)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]], partitions: int) -> None:
    """Create `topic` and write `records` round-robin over its partitions (idempotent producer)."""
    new_topic(bootstrap, topic, partitions)
    producer = Producer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 500_000,
                "enable.idempotence": True,
            },
            "producer",
        )
    )
    for i, (key, value) in enumerate(records):
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
