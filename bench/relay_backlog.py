"""The relay bench's topics and backlog: a topic made for each run and dropped after it, and the outbox
rows every publisher carries."""

from __future__ import annotations

import time
import uuid

import psycopg
from confluent_kafka.admin import AdminClient
from kafka_load import new_topic  # bench/kafka_load.py

from outbox.core.config import DatabaseUrl
from outbox.core.kafka import client_settings
from outbox.writer import Event, add_events

PARTITIONS = 3


def create_topic(bootstrap: str, name: str | None = None) -> str:
    name = name or f"bench.relay.{uuid.uuid4().hex[:8]}"
    new_topic(bootstrap, name, PARTITIONS)
    return name


def delete_topic(bootstrap: str, name: str) -> None:
    """Drop what a run published, so later runs meet a broker no fuller than the first did."""
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.delete_topics([name]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while name in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.1)


def fill(url: DatabaseUrl, topic: str, count: int, size: int, schema: str = "public") -> None:
    """The backlog: `count` rows of about `size` bytes, one COPY and commit per 50,000."""
    note = "x" * max(0, size - 40)
    with psycopg.connect(url.libpq) as conn:
        for start in range(0, count, 50_000):
            add_events(
                conn,
                [
                    Event(topic, {"n": n, "note": note}, key=f"key-{n % 1000}")
                    for n in range(start, min(count, start + 50_000))
                ],
                schema=schema,
            )
            conn.commit()
