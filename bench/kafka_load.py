"""Loading a topic fast for the benchmarks (shared by the scripts beside it)."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.probe import quiet_kafka_config


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]], partitions: int) -> None:
    """Create `topic` and write `records` round-robin over its partitions (idempotent producer)."""
    admin = AdminClient(quiet_kafka_config({"bootstrap.servers": bootstrap}))
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    producer = Producer(
        quiet_kafka_config(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 500_000,
                "enable.idempotence": True,
            }
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
