"""Read a topic's committed records once: from the start (or given offsets) to its end as of now.

The end is the high watermark seen when the read starts, not the Last Stable
Offset: a record committed after another producer's still-open transaction
lies beyond the LSO, and stopping there would miss it. The read waits for
such a transaction to end, up to `timeout`. One reader for the relay's
positions, `outbox verify` and the tests' verifier.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from typing import cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from outbox.core.errors import error
from outbox.core.kafka import about_the_group, client_settings

NEW_TOPIC_S = 5.0  # how long a topic that is not found is asked for again before it is said missing
HELD_AFTER_S = 5.0  # how long a read gets nothing, short of its end, before `held` is told


def read_committed(
    config: Mapping[str, object],
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    timeout: float = 60.0,
    stuck: str | None = None,
    held: Callable[[str], None] | None = None,
) -> list[Message]:
    """Every committed record of `topic`, per partition in offset order.

    config: client settings, `bootstrap.servers` included (security settings go
    along); stuck: the message when the end is not reached within `timeout`;
    held: told once, with where the read stands, when it has got nothing for
    HELD_AFTER_S short of its end (a transaction still open holds it there).
    """
    consumer, ends_of = _consumer(config, "read_committed"), _consumer(config, "read_uncommitted")
    servers = config.get("bootstrap.servers")
    deadline = time.monotonic() + timeout
    try:
        # A topic created a moment ago may be unknown yet to the broker asked: asked again, briefly.
        known_by = time.monotonic() + min(timeout, NEW_TOPIC_S)
        while True:
            try:
                metadata = consumer.list_topics(topic, timeout=min(timeout, 30))
            except KafkaException as exc:
                raise error("KAFKA_READ_UNREACHABLE", servers=servers, reason=exc.args[0].str()) from None
            found = metadata.topics.get(topic)
            if found is not None and found.error is None:
                break
            if time.monotonic() > known_by:
                raise error("KAFKA_TOPIC_MISSING", topic=topic, servers=servers)
            time.sleep(0.2)
        ends = {p: _end(ends_of, topic, p, str(servers), deadline) for p in found.partitions}
        first = _first(topic, start or {}, ends)
        pending = {p for p, end in ends.items() if end > max(first[p], 0)}
        consumer.assign([TopicPartition(topic, p, first[p]) for p in pending])
        out: list[Message] = []
        last_got = time.monotonic()

        def where() -> str:
            reached = {
                p.partition: p.offset for p in consumer.position([TopicPartition(topic, p) for p in pending])
            }
            return ", ".join(
                f"partition {p} at offset {reached.get(p, '?')} of {ends[p]}" for p in sorted(pending)
            )

        while pending:
            if held is not None and time.monotonic() - last_got > HELD_AFTER_S:
                held(where())
                held = None
            if time.monotonic() > deadline:
                if stuck:
                    raise error("KAFKA_READ_STUCK", stuck=stuck, where=where())
                raise error("KAFKA_READ_TIMEOUT", topic=topic, timeout=timeout, where=where())
            message = consumer.poll(0.5)
            if message is None:
                continue
            failure = message.error()
            partition, offset = place(message)
            if failure is None:
                last_got = time.monotonic()
                out.append(message)
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
            elif failure.code() == KafkaError._PARTITION_EOF:
                if offset >= ends[partition]:
                    pending.discard(partition)
            elif about_the_group(failure):
                continue
            elif failure.code() == KafkaError._AUTO_OFFSET_RESET and first[partition] >= 0:
                # A start below the log's (the beginning's own lookup failing is no such loss).
                raise error("KAFKA_START_GONE", topic=topic, partition=partition, offset=first[partition])
            else:
                raise error("KAFKA_READ_FAILED", topic=topic, servers=servers, reason=failure.str())
        return out
    finally:
        consumer.close()
        ends_of.close()


def _first(topic: str, start: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
    """Each partition's first offset: as given (OFFSET_END: its end now), else its beginning. A start
    the topic does not have would skip its partition without a word: refused."""
    for partition, offset in sorted(start.items()):
        if partition not in ends:
            raise error("KAFKA_START_NO_PARTITION", topic=topic, partition=partition, count=len(ends))
        if offset > ends[partition]:
            raise error(
                "KAFKA_START_OUTSIDE", topic=topic, partition=partition, offset=offset, end=ends[partition]
            )
    given = {p: ends[p] if offset == OFFSET_END else offset for p, offset in start.items()}
    return {p: given.get(p, OFFSET_BEGINNING) for p in ends}


def _consumer(config: Mapping[str, object], isolation: str) -> Consumer:
    """A consumer of no group's. Isolation sets which end librdkafka asks for too: read_committed
    gets the Last Stable Offset, so the ends are asked for read_uncommitted (the high watermark)."""
    return Consumer(
        client_settings(
            {
                "group.id": f"outbox-read-{uuid.uuid4().hex}",
                **config,
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",  # a start below the log's start: said, not moved to the end
            },
            "consumer",
        )
    )


def _end(consumer: Consumer, topic: str, partition: int, servers: str, deadline: float) -> int:
    """A partition's end (its high watermark), asked again until `deadline` while the cluster
    settles: a partition without a leader for now, or a new leader whose high watermark has not
    caught up yet (OFFSET_NOT_AVAILABLE, just after a broker restart)."""
    while True:
        try:
            asked = TopicPartition(topic, partition)
            return int(consumer.get_watermark_offsets(asked, timeout=10, cached=False)[1])
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise error(
                    "KAFKA_READ_END_UNKNOWN",
                    topic=topic,
                    partition=partition,
                    servers=servers,
                    reason=exc.args[0].str(),
                ) from None
            time.sleep(0.5)
            with contextlib.suppress(KafkaException):  # who leads it now: the client's map is stale
                consumer.list_topics(topic, timeout=5)


def place(message: Message) -> tuple[int, int]:
    """A fetched record's partition and offset (librdkafka types both as optional)."""
    return cast(int, message.partition()), cast(int, message.offset())
