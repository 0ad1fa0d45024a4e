"""Read a topic's committed records once, from the start (or given offsets) to its end as of now."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from outbox.errors import ConfigError, ServiceUnavailable
from outbox.probe import quiet_kafka_config
from outbox.verify.findings import Record, sequence


def committed(
    bootstrap: str, topic: str, start: Mapping[int, int] | None = None, timeout: float = 60.0
) -> list[Message]:
    """Every committed record (read_committed) from `start` (default: the beginning) up to the end now."""
    consumer = Consumer(
        quiet_kafka_config(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"outbox-verify-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    try:
        try:
            metadata = consumer.list_topics(timeout=min(timeout, 30))
        except KafkaException as exc:
            raise ServiceUnavailable(f"cannot reach Kafka at {bootstrap}: {exc.args[0].str()}") from None
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise ConfigError(f"topic {topic!r} does not exist on {bootstrap}")
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in metadata.topics[topic].partitions
        }
        first = {p: (start or {}).get(p, OFFSET_BEGINNING) for p in ends}
        pending = {p for p, end in ends.items() if end > max(first[p], 0)}
        consumer.assign([TopicPartition(topic, p, first[p]) for p in pending])
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ServiceUnavailable(
                    f"could not read partitions {sorted(pending)} of {topic} to their end in {timeout:.0f}s"
                    " (a transaction still open?)"
                )
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                out.append(message)
                if message.offset() + 1 >= ends[message.partition()]:
                    pending.discard(message.partition())
            elif error.code() == KafkaError._PARTITION_EOF:
                if message.offset() >= ends[message.partition()]:
                    pending.discard(message.partition())
            else:
                raise ServiceUnavailable(f"reading {topic}: {error.str()}")
        return out
    finally:
        consumer.close()


def record(
    message: Message, *, id_header: str | None, id_field: str | None, order_field: str | None
) -> Record:
    """The parts of a message the checks look at: its event id (a header or a JSON field) and sequence."""
    doc = _json(message.value()) if (id_field or order_field) else {}
    headers = {k: v for k, v in message.headers() or []}
    event_id = _text(doc.get(id_field)) if id_field else _text(headers.get(id_header or "event_id"))
    key = message.key()
    return Record(
        message.partition(),
        message.offset(),
        key.decode(errors="replace") if key is not None else None,
        event_id,
        sequence(_text(doc.get(order_field))) if order_field else None,
    )


def _json(value: bytes | None) -> dict:
    if value is None:
        return {}
    try:
        doc = json.loads(value)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
