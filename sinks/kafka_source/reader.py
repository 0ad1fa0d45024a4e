"""Read one offset range of one topic-partition into Arrow record batches.

Runs inside Spark tasks. Under transactions offsets have holes (commit and
abort markers, aborted records), so the record at `end - 1` may never be
delivered: the read is done when the consumer's position, which librdkafka
moves past markers and filtered records, or its fetch position (FetchPosition)
reaches `end`. It never waits for a record that will not come (SPARK-25005).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from outbox.core.kafka import about_the_group, client_settings
from sinks.errors import error
from sinks.kafka_source.ranges import Range

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
log = logging.getLogger("sinks.kafka_source")

ROWS_PER_BATCH = 50_000
CONSUME_BATCH = 10_000
WAIT_S = 0.2  # the longest one call waits for the next record
STATS_MS = 500  # how often librdkafka says where its fetch stands (FetchPosition)


class FetchPosition:
    """Where librdkafka's fetcher stands in the range's partition, as its statistics last said.

    A range can end in aborted records just before another producer's open transaction: the
    last stable offset stops the fetch there, so no abort marker and no record comes after
    them, and librdkafka moves its fetch position past the records it filters, but not the
    position it reports, which stayed before them until that transaction ended (a task waited
    out pollTimeoutMs and failed). librdkafka puts fetched records on the consumer's queue
    before it moves the fetch position, and its statistics come on the same queue: a call that
    served them and returned no record had every record below that position already.
    """

    def __init__(self, rng: Range) -> None:
        self.topic, self.partition = rng.topic, str(rng.partition)
        self.offset: int | None = None

    def __call__(self, stats: str) -> None:  # librdkafka's stats_cb, served inside consume()
        partition = json.loads(stats).get("topics", {}).get(self.topic, {}).get("partitions", {})
        offset = partition.get(self.partition, {}).get("next_offset")
        if isinstance(offset, int) and offset >= 0:
            self.offset = offset

    def take(self) -> int | None:
        """The position said since the last take, if any."""
        offset, self.offset = self.offset, None
        return offset


def read_range(
    config: dict[str, object],
    rng: Range,
    *,
    poll_timeout_s: float,
    fail_on_data_loss: bool,
    patience_s: float | None = None,
    stamped: bool = True,
) -> Iterator[pa.RecordBatch]:
    """patience_s: how long a read may go without progress before it fails (None: for ever); past
    `poll_timeout_s` without progress, a read that may wait longer says so once, and once more when
    it moves again. A stream waits (a cluster below quorum has no leader to read from for a while);
    a batch query fails at `poll_timeout_s`.

    stamped: False leaves the timestamps, their type and the headers null, for a reader that needs
    none (the sink's reading tasks): taking them from librdkafka cost two thirds of building the
    batch (0.3 of 0.45 us per record)."""
    # Records gone from the broker (retention) stop the read, or are skipped: librdkafka
    # moves to the earliest offset left, and what lies before the read's position is dropped.
    reset = "error" if fail_on_data_loss else "earliest"
    fetched = FetchPosition(rng)
    settings = client_settings(
        {**config, "auto.offset.reset": reset, "statistics.interval.ms": STATS_MS}, "consumer"
    )
    consumer = Consumer({**settings, "stats_cb": fetched})
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        patience = math.inf if patience_s is None else patience_s
        yield from _drain(consumer, rng, poll_timeout_s, patience, fetched, stamped)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer,
    rng: Range,
    poll_timeout_s: float,
    patience_s: float,
    fetched: FetchPosition,
    stamped: bool,
) -> Iterator[pa.RecordBatch]:
    tp = TopicPartition(rng.topic, rng.partition)
    rows: list[Message] = []
    position = rng.start
    moved_at = time.monotonic()
    said = False  # that the read waits
    while position < rng.end:
        before = position
        # What is fetched already, up to the range's end, without waiting; when nothing is, one
        # call that returns at the next record. consume(n, t) waits for all n records or for t:
        # a range's last call, short of n, waited t in every task of every micro-batch.
        messages = consumer.consume(min(CONSUME_BATCH, rng.end - position), 0)
        if not messages:
            position = _past_holes(consumer, tp, position, rng.end)
            if position < rng.end:
                fetched.take()  # only what a call that returns nothing serves counts
                messages = consumer.consume(1, WAIT_S)
                if not messages and (ahead := fetched.take()) is not None and ahead > position:
                    position = min(ahead, rng.end)
        if messages and (failed := [m for m in messages if m.error() is not None]):  # rare: one pass
            messages = [m for m in messages if not ((e := m.error()) is not None and about_the_group(e))]
            if failed := [m for m in failed if not about_the_group(cast(KafkaError, m.error()))]:
                _raise(failed, rng, position)
        if messages and _offset(messages[0]) < position:  # after a reset to the earliest offset
            messages = [m for m in messages if _offset(m) >= position]  # what was read, read once
        if messages:
            # One partition's messages arrive in offset order: only the last one can cross `end`.
            last = _offset(messages[-1])
            if last >= rng.end:
                messages = [m for m in messages if _offset(m) < rng.end]
                position = rng.end
            else:
                position = last + 1
            rows += messages
        if position < rng.end:
            position = _past_holes(consumer, tp, position, rng.end)
        if len(rows) >= ROWS_PER_BATCH:
            yield to_arrow(rows, rng, stamped)
            rows = []
        now = time.monotonic()
        if position > before:
            if said:
                log.warning("%s-%s: reading again after %.0fs", rng.topic, rng.partition, now - moved_at)
                said = False
            moved_at = now
        elif now - moved_at > poll_timeout_s:
            if now - moved_at > patience_s:
                option = "pollTimeoutMs" if patience_s <= poll_timeout_s else "unavailableTimeoutMs"
                raise error(
                    "KAFKA_RC_READ_STALLED",
                    topic=rng.topic,
                    partition=rng.partition,
                    offset=position,
                    end=rng.end,
                    seconds=now - moved_at,
                    option=option,
                )
            if not said:
                stalled = (
                    f"{rng.topic}-{rng.partition}: no progress at offset {position} (reading up to {rng.end})"
                    f" for {now - moved_at:.0f}s; is the broker reachable?"
                )
                log.warning("%s; waiting for it (option unavailableTimeoutMs)", stalled)
                said = True
    if rows:
        yield to_arrow(rows, rng, stamped)


def _past_holes(consumer: Consumer, tp: TopicPartition, position: int, end: int) -> int:
    """Markers and filtered records move the consumer's position, not the records it returns."""
    moved = consumer.position([tp])[0].offset
    return min(moved, end) if moved is not None and moved > position else position


def _offset(message: Message) -> int:
    """A fetched record's offset (librdkafka gives None only to an error without one)."""
    return cast(int, message.offset())


def _raise(failed: list[Message], rng: Range, position: int) -> None:
    failed_with = cast(KafkaError, failed[0].error())
    if failed_with.code() == KafkaError._AUTO_OFFSET_RESET:
        raise error("KAFKA_RC_OFFSET_GONE", topic=rng.topic, partition=rng.partition, offset=position)
    raise error("KAFKA_RC_READ_FAILED", topic=rng.topic, partition=rng.partition, reason=failed_with.str())


def to_arrow(messages: list[Message], rng: Range, stamped: bool = True) -> pa.RecordBatch:
    """Columns straight from librdkafka's messages; topic and partition are constants."""
    n = len(messages)
    if stamped:
        timestamps = [m.timestamp() for m in messages]
        stamps = [
            pa.array([ts * 1000 if kind else None for kind, ts in timestamps], pa.timestamp("us", tz="UTC")),
            # librdkafka: 1 create time, 2 log append time; Spark: 0 create, 1 log append.
            pa.array([1 if kind == 2 else 0 for kind, _ in timestamps], pa.int32()),
            _headers_column([m.headers() for m in messages]),
        ]
    else:
        stamps = [pa.nulls(n, ARROW_SCHEMA.field(f).type) for f in ("timestamp", "timestampType", "headers")]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([m.value() for m in messages], pa.binary()),
            pa.repeat(pa.scalar(rng.topic, pa.string()), n),
            pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
            pa.array([m.offset() for m in messages], pa.int64()),
            *stamps,
        ],
        schema=ARROW_SCHEMA,
    )


def _headers_column(headers: Sequence[Any]) -> pa.Array:
    """Each record's headers (a list of (key, value) pairs, or None) as Spark's column."""
    kind = ARROW_SCHEMA.field("headers").type
    if not any(headers):  # the common case: no record has headers
        return pa.ListArray.from_arrays(
            pa.array([0] * (len(headers) + 1), pa.int32()), pa.array([], kind.value_type)
        )
    return pa.array(
        [[{"key": k, "value": v.encode() if isinstance(v, str) else v} for k, v in h or ()] for h in headers],
        kind,
    )
