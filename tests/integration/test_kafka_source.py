"""The kafka_rc source against a real broker and a real SparkSession."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from outbox.core.config import DatabaseUrl
from tests.cli import outbox
from tests.helpers import (
    add_partitions,
    create_topic,
    produce_transaction,
    read_committed,
    transactional_producer,
    unique,
    wait_for,
)
from tests.source_support import batch_read, records, stream, stream_to_memory


def test_committed_visible_aborted_never_open_only_once_committed(
    spark: SparkSession, bootstrap: str, topic: str
) -> None:
    committer, aborter = transactional_producer(bootstrap), transactional_producer(bootstrap)
    produce_transaction(committer, topic, records(300, "c1"))
    produce_transaction(aborter, topic, records(200, "aborted"), commit=False)
    produce_transaction(committer, topic, records(300, "c2"))
    opener = transactional_producer(bootstrap)
    opener.begin_transaction()
    for key, value in records(50, "open"):
        opener.produce(topic, key=key, value=value)
    opener.flush(30)

    rows = batch_read(spark, bootstrap, topic)
    values = Counter(r.value.decode().rsplit("-", 1)[0] for r in rows)
    assert values == {"c1": 300, "c2": 300}
    assert len({(r.partition, r.offset) for r in rows}) == 600

    opener.commit_transaction(30)
    rows = batch_read(spark, bootstrap, topic)
    assert Counter(r.value.decode().rsplit("-", 1)[0] for r in rows) == {"c1": 300, "c2": 300, "open": 50}
    # Same records, same positions as a plain read_committed consumer sees.
    expected = sorted((p, o, k, v) for p, o, k, v in read_committed(bootstrap, topic, 2))
    assert sorted((r.partition, r.offset, r.key, r.value) for r in rows) == expected


def test_markers_at_the_end_of_a_range_neither_hang_nor_lose(spark: SparkSession, bootstrap: str) -> None:
    name = create_topic(bootstrap, unique("holes"), partitions=1)
    producer, aborter = transactional_producer(bootstrap), transactional_producer(bootstrap)
    produce_transaction(producer, name, records(10, "c"))  # offsets 0-9, marker 10
    produce_transaction(aborter, name, records(5, "a"), commit=False)  # 11-15, marker 16
    # The range ends on markers and aborted records: no record at end - 1 will ever be
    # delivered. A reader that waits for one fails with a timeout (pollTimeoutMs) here.
    rows = batch_read(spark, bootstrap, name)
    assert [r.offset for r in rows] == list(range(10))
    rows = batch_read(spark, bootstrap, name, startingOffsets=f'{{"{name}":{{"0":10}}}}')
    assert rows == []


def test_aborted_records_just_before_an_open_transaction_neither_hang_nor_lose(
    spark: SparkSession, bootstrap: str
) -> None:
    """A aborts after B opened on the same partition: A's abort marker lies past the last stable
    offset (B's first record), which a read_committed fetch never reaches, and A's skipped records
    deliver nothing. The range ends where B begins; its reader must not wait for B."""
    name = create_topic(bootstrap, unique("tail"), partitions=1)
    committed, a, b = (transactional_producer(bootstrap) for _ in range(3))
    produce_transaction(committed, name, records(3, "c"))  # offsets 0-2, marker 3
    a.begin_transaction()
    for key, value in records(5, "a"):
        a.produce(name, key=key, value=value, partition=0)  # 4-8
    a.flush(30)
    b.begin_transaction()
    b.produce(name, value=b"open", partition=0)  # 9: the last stable offset until B ends
    b.flush(30)
    a.abort_transaction(30)  # marker 10, past the last stable offset
    try:
        rows = batch_read(spark, bootstrap, name, pollTimeoutMs="20000")
        assert [r.offset for r in rows] == [0, 1, 2]
    finally:
        b.abort_transaction(30)


def test_a_start_inside_an_open_transaction_is_waited_for_not_taken_for_a_truncated_log(
    spark: SparkSession, bootstrap: str
) -> None:
    """An offset between the last stable offset and the high watermark (from a read_uncommitted tool,
    or a ledger Spark's own source wrote) lies inside a transaction still open, not past the log's
    end: it was refused as KAFKA_RC_LOG_TRUNCATED (or, with failOnDataLoss=false, read again from
    the earliest offset)."""
    name = create_topic(bootstrap, unique("inside"), partitions=1)
    committed, opener = transactional_producer(bootstrap), transactional_producer(bootstrap)
    produce_transaction(committed, name, records(5, "c"))  # offsets 0-4, marker 5

    def end(isolation: str) -> int:
        config = {"bootstrap.servers": bootstrap, "group.id": unique("g"), "isolation.level": isolation}
        consumer = Consumer(config)
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=10, cached=False)[1])
        finally:
            consumer.close()

    # The coordinator writes the marker after it answered the commit: wait for it, so offsets are known.
    wait_for(lambda: end("read_committed") == end("read_uncommitted") == 6, 30, "the commit's marker")
    opener.begin_transaction()
    for key, value in records(3, "open"):
        opener.produce(name, key=key, value=value, partition=0)  # 6-8: the last stable offset is 6
    opener.flush(30)
    inside = f'{{"{name}":{{"0":7}}}}'
    assert batch_read(spark, bootstrap, name, startingOffsets=inside) == []
    rows = batch_read(spark, bootstrap, name, startingOffsets=inside, failOnDataLoss="false")
    assert rows == []  # not the committed records from offset 0 again
    opener.commit_transaction(30)  # marker 9
    rows = batch_read(spark, bootstrap, name, startingOffsets=inside)
    assert [(r.offset, r.value.decode()) for r in rows] == [(7, "open-1"), (8, "open-2")]
    # Past the high watermark it is still a truncated log, said as one.
    with pytest.raises(Exception, match="KAFKA_RC_LOG_TRUNCATED"):
        batch_read(spark, bootstrap, name, startingOffsets=f'{{"{name}":{{"0":11}}}}')


def test_a_batch_with_nothing_to_read_is_empty(spark: SparkSession, bootstrap: str) -> None:
    """No range to read: pyspark still runs one task, with a partition of None (it failed with
    TypeError: 'NoneType' object is not iterable)."""
    assert batch_read(spark, bootstrap, create_topic(bootstrap, unique("empty"), partitions=2)) == []


def test_ending_offsets_and_partition_json(spark: SparkSession, bootstrap: str, topic: str) -> None:
    produce_transaction(transactional_producer(bootstrap), topic, records(40, "r"), partition=0)
    rows = batch_read(
        spark,
        bootstrap,
        topic,
        startingOffsets=f'{{"{topic}":{{"0":5,"1":-2}}}}',
        endingOffsets=f'{{"{topic}":{{"0":25,"1":-1}}}}',
    )
    assert sorted(r.offset for r in rows) == list(range(5, 25))


def test_max_offsets_per_trigger_is_respected(
    spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path
) -> None:
    producer = transactional_producer(bootstrap)
    for i in range(5):
        produce_transaction(producer, topic, records(60, f"t{i}"))
    query, table = stream_to_memory(
        spark, bootstrap, topic, checkpoint, available_now=True, maxOffsetsPerTrigger="50"
    )
    query.awaitTermination(120)
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 6
    for progress in query.recentProgress:
        (source,) = progress["sources"]
        start = json.loads(source["startOffset"] or "null") or {}
        end = json.loads(source["endOffset"])
        span = sum(int(o) - int(start.get(topic, {}).get(p, 0)) for p, o in end[topic].items())
        assert span <= 50, progress
    got = spark.sql(f"select value from {table}").collect()
    assert len(got) == 300 and len({r.value for r in got}) == 300


def test_partitions_added_while_running_are_read(
    spark: SparkSession, bootstrap: str, checkpoint: Path
) -> None:
    name = create_topic(bootstrap, unique("grow"), partitions=1)
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, name, records(10, "before"), partition=0)
    query, sink = stream_to_memory(spark, bootstrap, name, checkpoint, available_now=False)
    try:
        wait_for(lambda: spark.sql(f"select count(*) c from {sink}").first().c == 10, 120, "first 10 rows")
        add_partitions(bootstrap, name, 3)
        producer2 = transactional_producer(bootstrap)
        produce_transaction(producer2, name, records(7, "p2"), partition=2)
        wait_for(
            lambda: spark.sql(f"select count(*) c from {sink} where partition = 2").first().c == 7,
            120,
            "rows of the new partition",
        )
    finally:
        query.stop()
    assert spark.sql(f"select count(*) c from {sink}").first().c == 17


@pytest.mark.parametrize("starting", ["earliest", "latest"])
def test_start_from_the_sinks_ledger_when_the_checkpoint_is_lost(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    database: DatabaseUrl,
    pg: psycopg.Connection,
    checkpoint: Path,
    starting: str,
) -> None:
    """A partition of a topic the ledger knows, without a row of its own (added while the query was
    down, or empty while it ran), holds nothing the sink applied: with startingOffsets=latest its
    records were skipped."""
    produce_transaction(transactional_producer(bootstrap), topic, records(100, "r"), partition=0)
    produce_transaction(transactional_producer(bootstrap), topic, records(100, "s"), partition=1)
    assert outbox("db", "upgrade", "--url", database.raw).code == 0
    # What an exactly-once sink named "orders" recorded before its checkpoint was lost.
    pg.execute(
        "insert into sink_progress (sink, topic, kafka_partition, next_offset) values"
        " ('orders', %s, 0, 60), ('other-sink', %s, 1, 99)",
        [topic, topic],
    )
    query, sink = stream_to_memory(
        spark,
        bootstrap,
        topic,
        checkpoint,
        available_now=True,
        **{"ledger.sink": "orders", "ledger.url": database.raw, "startingOffsets": starting},
    )
    query.awaitTermination(120)
    got = Counter((r.partition, r.offset) for r in spark.sql(f"select * from {sink}").collect())
    assert max(got.values()) == 1
    # Partition 0 resumes at the ledger's offset 60; partition 1 has no entry for this sink.
    assert {o for p, o in got if p == 0} == set(range(60, 100))
    assert {o for p, o in got if p == 1} == set(range(100))

    rows = batch_read(spark, bootstrap, topic, **{"ledger.sink": "orders", "ledger.url": database.raw})
    assert sorted(r.offset for r in rows if r.partition == 0) == list(range(60, 100))


def test_min_partitions_splits_ranges_without_losing_or_repeating(
    spark: SparkSession, bootstrap: str, topic: str
) -> None:
    producer = transactional_producer(bootstrap)
    for i in range(4):
        produce_transaction(producer, topic, records(50, f"t{i}"), partition=0)
    df = (
        spark.read.format("kafka_rc")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("minPartitions", "6")
        .load()
    )
    assert df.rdd.getNumPartitions() >= 6
    offsets = [r.offset for r in df.collect()]
    assert len(offsets) == 200 and len(set(offsets)) == 200


def test_small_partitions_are_read_together_in_few_tasks_each_record_once(
    spark: SparkSession, bootstrap: str
) -> None:
    topic = create_topic(bootstrap, unique("many"), partitions=8)
    producer = transactional_producer(bootstrap)
    for partition in range(8):
        produce_transaction(producer, topic, records(30, f"p{partition}"), partition=partition)

    def read(**options: str) -> tuple[int, list[tuple[int, int]]]:
        df = (
            spark.read.format("kafka_rc")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
        )
        for name, value in options.items():
            df = df.option(name, value)
        frame = df.load()
        return frame.rdd.getNumPartitions(), sorted((r.partition, r.offset) for r in frame.collect())

    every = sorted((p, o) for p in range(8) for o in range(30))
    assert read() == (1, every)  # 248 offsets, below 10,000: one task
    # Each range is 31 offsets (30 records and the commit marker): four make 124 >= 100, twice.
    assert read(minRecordsPerTask="100") == (2, every)
    assert read(minRecordsPerTask="1") == (8, every)  # one task each


def test_a_deleted_topic_stops_the_query_with_a_clear_error(
    spark: SparkSession, bootstrap: str, checkpoint: Path
) -> None:
    from confluent_kafka.admin import AdminClient
    from pyspark.errors import StreamingQueryException

    name = create_topic(bootstrap, unique("doomed"), partitions=1)
    produce_transaction(transactional_producer(bootstrap), name, records(5, "r"))
    query, sink = stream_to_memory(spark, bootstrap, name, checkpoint, available_now=False)
    try:
        wait_for(lambda: spark.sql(f"select count(*) c from {sink}").first().c == 5, 120, "first rows")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics([name]).values():
            future.result(30)
        with pytest.raises(
            StreamingQueryException, match=rf"\[KAFKA_RC_TOPIC_(DELETED|MISSING)\] topic.*{name}"
        ):
            query.awaitTermination(120)
    finally:
        query.stop()


@pytest.mark.parametrize("start", [7, 8])
def test_a_read_starting_at_or_after_an_abort_marker_keeps_later_commits(
    spark: SparkSession, bootstrap: str, start: int
) -> None:
    """A range that begins right after an aborted transaction still gets the same producer's later commits.

    librdkafka filters aborted records by the broker's aborted-transaction list;
    a list that named transactions ended before the fetch offset would drop
    these silently.
    """
    name = create_topic(bootstrap, unique("abort"), partitions=1)
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, name, records(3, "c"))  # 0-2, marker 3
    produce_transaction(producer, name, records(3, "a"), commit=False)  # 4-6, marker 7
    produce_transaction(producer, name, records(2, "late"))  # 8-9, marker 10
    rows = batch_read(spark, bootstrap, name, startingOffsets=json.dumps({name: {"0": start}}))
    assert sorted((r.offset, r.value) for r in rows) == [(8, b"late-0"), (9, b"late-1")]


def test_a_checkpoint_of_another_subscription_is_named_as_such(
    spark: SparkSession, bootstrap: str, checkpoint: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    first, second = (create_topic(bootstrap, unique("sub"), partitions=1) for _ in range(2))
    for name in (first, second):
        produce_transaction(transactional_producer(bootstrap), name, records(2, name))

    def to_noop(topic: str) -> StreamingQuery:
        frame = stream(spark, bootstrap, topic)
        writer = frame.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        return writer.trigger(availableNow=True).start()

    to_noop(first).awaitTermination(120)
    query = to_noop(second)
    with pytest.raises(
        StreamingQueryException,
        match=rf"\[KAFKA_RC_CHECKPOINT_OTHER_SUBSCRIPTION\] .*of topic.s. {first}.*another subscription",
    ):
        query.awaitTermination(120)
    query.stop()
