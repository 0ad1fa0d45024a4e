"""The Spark data source: registered as `kafka_rc`, batch and streaming.

Planning (which partitions, which offsets) happens on the driver through
`Cluster` and the plain functions in `offsets`; tasks only read ranges.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from outbox.core.errors import OutboxError, ServiceUnavailable
from sinks.errors import KAFKA_RC_LOSS_ADVICE, error
from sinks.kafka_source import ranges
from sinks.kafka_source.cluster import Cluster
from sinks.kafka_source.options import ENDING, SourceOptions, parse
from sinks.kafka_source.reader import read_range
from sinks.kafka_source.stalls import Leaderless, Stall, gaps, leaderless, names, watch
from sinks.ledger import recreated, recreated_error

log = logging.getLogger("sinks.kafka_source")

FORMAT = "kafka_rc"
UNCOMMITTED = "#uncommitted"  # progress: records past the LSO, per topic and partition
GONE_S = 5.0  # how long offsets that cannot be read are checked against a topic's deletion
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp,"
    " timestampType int, headers array<struct<key:string,value:binary>>"
)


class KafkaSource(DataSource):
    """`spark.readStream.format("kafka_rc").option("kafka.bootstrap.servers", ...)`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(parse(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if any(k.lower() == ENDING.name.lower() for k in self.options):  # Spark's refuses it too
            raise error("KAFKA_RC_OPTION_UNSUPPORTED", option=ENDING.name, why="a stream does not end")
        return KafkaStreamReader(parse(self.options))


def starting_positions(
    cluster: Cluster,
    options: SourceOptions,
    tps: list[ranges.TopicPartitionKey],
    earliest: dict[ranges.TopicPartitionKey, int],
    latest: dict[ranges.TopicPartitionKey, int],
    ids: ranges.TopicIds,
) -> dict[ranges.TopicPartitionKey, int]:
    """startingOffsets, overlaid with the sink's ledger when `ledger.sink` is set.

    The ledger's offsets of a topic created again since count for nothing: its
    new records are read from the earliest (failOnDataLoss=false), or the query
    stops with the line that says so. A partition of a topic the ledger knows,
    with no row of its own (added while the query was down, or empty while it
    ran), holds nothing the sink applied: it is read from its earliest offset,
    whatever startingOffsets says (`latest` skipped its records).
    """
    start = ranges.resolve(options.starting, tps, earliest, latest, option="startingOffsets")
    read_under: ranges.TopicIds = {}  # the ids the ledger's offsets were read under, where it has them
    if options.ledger is not None:
        recorded, recorded_ids = options.ledger.read()
        for topic in (new := recreated(recorded_ids, ids)):
            lost = recreated_error(options.ledger.sink, topic, recorded_ids[topic], ids[topic])
            if options.fail_on_data_loss:
                raise lost
            log.warning("%s; reading it from its earliest offset", lost.message.split(": the sink")[0])
        known = {tp[0] for tp in recorded} - set(new)
        start = {tp: earliest[tp] if tp[0] in new or tp[0] in known else o for tp, o in start.items()}
        start = ranges.overlay(start, {tp: o for tp, o in recorded.items() if tp[0] not in new})
        read_under = {t: i for t, i in recorded_ids.items() if t not in new}
    start, losses = ranges.reconcile(start, read_under, ids, earliest, cluster.log_ends(start, latest))
    judge(losses, options, warn=True)
    return start


def judge(losses: list[OutboxError], options: SourceOptions, *, warn: bool) -> None:
    """Stop at the first loss, or (failOnDataLoss=false) log each and go on, as Spark's source does."""
    if losses and options.fail_on_data_loss:
        raise losses[0]
    for loss in losses if warn else ():
        said = loss.message.removesuffix(KAFKA_RC_LOSS_ADVICE)
        log.warning("%s; going on with the records still there (failOnDataLoss=false)", said)


def _input_partitions(
    options: SourceOptions,
    start: dict[ranges.TopicPartitionKey, int],
    end: dict[ranges.TopicPartitionKey, int],
) -> list[InputPartition]:
    """A task's ranges: cut by minPartitions, one each; else small ones packed (minRecordsPerTask)."""
    rngs = ranges.ranges(start, end)
    if options.min_partitions:
        return [InputPartition((r,)) for r in ranges.split(rngs, options.min_partitions)]
    return [InputPartition(task) for task in ranges.pack(rngs, options.min_records_per_task)]


def _read(options: SourceOptions, partition: InputPartition, *, waits: bool) -> Iterator[pa.RecordBatch]:
    """A batch with nothing to read still gets one task, whose partition holds None (pyspark's own)."""
    return read_ranges(options, partition.value or (), waits=waits)


def read_ranges(
    options: SourceOptions, rngs: Iterable[ranges.Range], *, waits: bool, stamped: bool = True
) -> Iterator[pa.RecordBatch]:
    """A task's ranges, one after the other (the sink's reading tasks too: postgres/direct.py).

    waits: a stream's read waits out a Kafka without a leader to read from, as its driver does
    (for `unavailableTimeoutMs`, or for ever); a batch query's fails after `pollTimeoutMs`.
    stamped: reader.read_range's."""
    for rng in rngs:
        yield from read_range(
            options.consumer_config(),
            rng,
            poll_timeout_s=options.poll_timeout_s,
            fail_on_data_loss=options.fail_on_data_loss,
            patience_s=options.unavailable_timeout_s if waits else options.poll_timeout_s,
            stamped=stamped,
        )


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        cluster = Cluster(self.options, waits=False)
        tps = cluster.partitions()
        earliest, latest = cluster.earliest(tps), cluster.latest(tps)
        ids = cluster.topic_ids(t for t, _ in tps)
        start = starting_positions(cluster, self.options, tps, earliest, latest, ids)
        end = ranges.resolve(self.options.ending, tps, earliest, latest, option="endingOffsets")
        ranges.check_ends(start, self.options.ending)
        # Never past the Last Stable Offset, whatever endingOffsets says.
        end = {tp: min(offset, latest[tp]) for tp, offset in end.items()}
        return _input_partitions(self.options, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition, waits=False)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._cluster: Cluster | None = None
        self._target: dict[ranges.TopicPartitionKey, int] | None = None  # Trigger.AvailableNow
        self._stalls: dict[ranges.TopicPartitionKey, Stall] = {}
        self._leaderless: dict[ranges.TopicPartitionKey, Leaderless] = {}
        self._stall_limit: float | None = None
        self._report: dict[str, Any] | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.options)
        return self._cluster

    def initialOffset(self) -> dict[str, Any]:
        tps = self.cluster.partitions()
        earliest, latest = self.cluster.earliest(tps), self.cluster.latest(tps)
        ids = self.cluster.topic_ids(t for t, _ in tps)
        start = starting_positions(self.cluster, self.options, tps, earliest, latest, ids)
        return ranges.to_offsets(start, ids)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.cluster.latest(self.cluster.partitions())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = ranges.from_offsets(start)
        tps = self._still_there(begin)
        ids = self.cluster.topic_ids(t for t, _ in tps)
        try:
            # A partition without a leader is left out of both: read around, held where it is. Not
            # under Trigger.AvailableNow, which reads everything there was when it began, then ends.
            around = self._target is None
            earliest = self.cluster.earliest(tps, partial=around)
            latest = self.cluster.latest([tp for tp in tps if tp in earliest], partial=around)
        except ServiceUnavailable:
            # A topic deleted between the metadata read and the offsets' (the broker answers
            # "no leaders found"): said as the deletion it is, once the metadata shows it.
            deadline = time.monotonic() + GONE_S
            while time.monotonic() < deadline:
                self._still_there(begin)
                time.sleep(0.5)
            raise
        self._read_around([tp for tp in tps if tp not in latest])
        self._watch(latest, ids)
        ends = self.cluster.log_ends(begin, latest)
        begin, losses = ranges.reconcile(begin, ranges.topic_ids(start), ids, earliest, ends)
        new, late = ranges.added(begin, earliest, latest)  # partitions added while running
        judge(losses + late, self.options, warn=True)
        begin.update(new)
        if self._target is not None:
            latest = {tp: min(off, self._target.get(tp, begin[tp])) for tp, off in latest.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return ranges.to_offsets(ranges.hold(begin, ranges.cap(begin, latest, max_rows)), ids)

    def _read_around(self, waiting: list[ranges.TopicPartitionKey]) -> None:
        """Partitions without a leader: said once they have waited as long as Kafka's silence is
        before it is said, and again when they have a leader; past `unavailableTimeoutMs`, the end."""
        now = time.monotonic()
        self._leaderless, lines = leaderless(self._leaderless, waiting, now, self.cluster.timeout)
        for line in lines:
            log.warning(line)
        patience = self.options.unavailable_timeout_s
        longest = max((now - w.since for w in self._leaderless.values()), default=0.0)
        if patience is not None and longest > patience:
            raise error(
                "KAFKA_RC_CLUSTER_UNAVAILABLE",
                doing=f"read {names(waiting)}",
                servers=self.options.bootstrap_servers,
                reason="no leader (the brokers of its replicas are down)",
                seconds=longest,
            )

    def _still_there(self, begin: dict[ranges.TopicPartitionKey, int]) -> list[ranges.TopicPartitionKey]:
        """The subscribed partitions now; an error naming any topic read so far that is gone."""
        tps = self.cluster.partitions()
        gone = sorted({t for t, _ in begin} - {t for t, _ in tps})
        if gone:
            raise unsubscribed(gone, self.cluster.topics(), self.options)
        return tps

    def _watch(self, lso: dict[ranges.TopicPartitionKey, int], ids: ranges.TopicIds) -> None:
        """Open transactions' hold on the LSO: in the progress (`latestOffset`), warned once when long."""
        if self.options.read_uncommitted:
            return
        hw = self.cluster.high_watermarks(lso, partial=True)
        if self._stall_limit is None:
            self._stall_limit = self.options.stall_warn_s or self.cluster.max_transaction_timeout()
        self._stalls, warnings = watch(self._stalls, lso, hw, time.monotonic(), self._stall_limit)
        for warning in warnings:
            log.warning(warning)
        self._report = {**ranges.to_offsets(lso, ids), UNCOMMITTED: gaps(lso, hw)}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The partitions' last stable offsets, and under "#uncommitted" the records an open
        transaction still holds back: shown as the source's latestOffset in the query's progress."""
        return self._report

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The ranges from `start` to `end`, where `start` still holds (`latestOffset` judged it)."""
        begin, stop = ranges.from_offsets(start), ranges.from_offsets(end)
        # A partition the batch holds where it was (no leader, or nothing new) is not asked about.
        earliest = self.cluster.earliest(tp for tp, offset in stop.items() if begin.get(tp) != offset)
        begin, losses = ranges.reconcile(
            begin, ranges.topic_ids(start), ranges.topic_ids(end), earliest, stop
        )
        judge(losses, self.options, warn=False)
        begin.update({tp: earliest.get(tp, stop[tp]) for tp in stop if tp not in begin})
        return _input_partitions(self.options, begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition, waits=True)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint (or the sink's ledger) holds the offsets."""


def unsubscribed(topics: list[str], existing: set[str], options: SourceOptions) -> OutboxError:
    """The error for checkpointed topics the query no longer reads: deleted, or another subscription's."""
    present = [t for t in topics if t in existing]
    if present:
        return error(
            "KAFKA_RC_CHECKPOINT_OTHER_SUBSCRIPTION",
            topics=", ".join(present),
            subscription=options.subscription,
        )
    return error("KAFKA_RC_TOPIC_DELETED", topics=", ".join(topics))


def register(spark: SparkSession) -> None:
    """Make `format("kafka_rc")` available in this session."""
    spark.dataSource.register(KafkaSource)
