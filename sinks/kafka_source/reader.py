"""Read one offset range of one topic-partition into Arrow record batches.

Runs inside Spark tasks. Under transactions offsets have holes (commit and
abort markers, aborted records), so the record at `end - 1` may never be
delivered: the read is done when the consumer's position, which librdkafka
moves past markers and filtered records, reaches `end`. It never waits for a
record that will not come (SPARK-25005).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from outbox.probe import quiet_kafka_config
from sinks.kafka_source.offsets import Range

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
ROWS_PER_BATCH = 20_000
CONSUME_BATCH = 5_000


class DataLossError(RuntimeError):
    """Offsets the query needs are gone from the broker (retention, deleted topic)."""


def read_range(
    config: dict[str, object],
    rng: Range,
    *,
    poll_timeout_s: float,
    fail_on_data_loss: bool,
) -> Iterator[pa.RecordBatch]:
    consumer = Consumer(quiet_kafka_config({**config, "auto.offset.reset": "error"}))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        yield from _drain(consumer, rng, poll_timeout_s, fail_on_data_loss)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer, rng: Range, poll_timeout_s: float, fail_on_data_loss: bool
) -> Iterator[pa.RecordBatch]:
    tp = TopicPartition(rng.topic, rng.partition)
    rows: list[Message] = []
    position = rng.start
    deadline = time.monotonic() + poll_timeout_s
    while position < rng.end:
        messages = consumer.consume(CONSUME_BATCH, 0.2)
        before = position
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._AUTO_OFFSET_RESET and not fail_on_data_loss:
                    continue  # librdkafka cannot seek there; nothing to read
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise DataLossError(
                        f"{rng.topic}-{rng.partition}: offset {position} is no longer on the broker"
                        " (removed by retention?); set failOnDataLoss=false to skip what is gone"
                    )
                raise RuntimeError(f"{rng.topic}-{rng.partition}: {error.str()}")
            offset = message.offset()
            if offset >= rng.end:
                position = rng.end
                break
            rows.append(message)
            position = offset + 1
        if position < rng.end:
            # Skip holes: markers and filtered records move the position, not the records.
            moved = consumer.position([tp])[0].offset
            if moved is not None and moved > position:
                position = min(moved, rng.end)
        if len(rows) >= ROWS_PER_BATCH:
            yield to_arrow(rows)
            rows = []
        if position > before:
            deadline = time.monotonic() + poll_timeout_s
        elif time.monotonic() > deadline:
            raise TimeoutError(
                f"{rng.topic}-{rng.partition}: no progress at offset {position} (reading up to"
                f" {rng.end}) for {poll_timeout_s:.0f}s; is the broker reachable? (option pollTimeoutMs)"
            )
    if rows:
        yield to_arrow(rows)


def to_arrow(messages: list[Message]) -> pa.RecordBatch:
    """Columns straight from librdkafka's messages, no per-row Python objects kept."""
    timestamps = [m.timestamp() for m in messages]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.array([m.topic() for m in messages], pa.string()),
            pa.array([m.partition() for m in messages], pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([ts * 1000 if kind else None for kind, ts in timestamps], pa.timestamp("us", tz="UTC")),
            pa.array([_spark_timestamp_type(kind) for kind, _ in timestamps], pa.int32()),
            pa.array([_headers(m) for m in messages], ARROW_SCHEMA.field("headers").type),
        ],
        schema=ARROW_SCHEMA,
    )


def _spark_timestamp_type(kind: int) -> int:
    # librdkafka: 0 none, 1 create time, 2 log append time; Spark: 0 create, 1 log append.
    return 1 if kind == 2 else 0


def _headers(message: Message) -> list[dict[str, object]] | None:
    headers = message.headers()
    if headers is None:
        return []
    return [{"key": k, "value": v.encode() if isinstance(v, str) else v} for k, v in headers]
