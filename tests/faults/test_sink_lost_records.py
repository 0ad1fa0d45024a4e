"""Records Kafka lost or replaced under a running sink: a topic created again, retention ahead of the reader.

The sink's ledger skips every offset below its next offset as applied. A topic
deleted and created again under its name starts over at offset 0, so its new
records would be skipped, and a checkpoint past the new log's start would skip
the rest (issue 25, case 1). Records deleted before the query read them must
stop the query, or with failOnDataLoss=false be skipped without a stall
(case 2). Every test checks the table row by row against what was produced.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.errors import StreamingQueryException

from outbox.core.errors import DataLossError
from outbox.core.kafka import client_settings
from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import read_range
from sinks.postgres import PostgresSink, parse_json
from tests.helpers import create_topic, produce_transaction, transactional_producer, unique, wait_for
from tests.sink_support import SCHEMA, event, ledger, run, table
from tests.source_support import stream


def orders(bootstrap: str, topic: str, count: int, partition: int = 0) -> dict[str, tuple]:
    """`count` new orders in one committed transaction (offsets count on, plus one commit marker)."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    records = [event(i, n) for n, i in enumerate(ids)]
    produce_transaction(transactional_producer(bootstrap), topic, records, partition=partition)
    return {i: (n, Decimal("1.00"), None) for n, i in enumerate(ids)}


def delete_records(bootstrap: str, topic: str, before: int, partition: int = 0) -> None:
    """What retention does to a log, at a chosen offset: its start moves to `before`."""
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        future.result(30)


def recreate(bootstrap: str, topic: str) -> None:
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.delete_topics([topic]).values():
        future.result(30)

    def created() -> bool:
        try:
            create_topic(bootstrap, topic)
        except Exception:  # still being deleted
            return False
        return True

    wait_for(created, 60, f"topic {topic} created again")


@pytest.mark.parametrize("source", ["kafka_rc", "kafka"])
def test_a_topic_created_again_stops_the_query_then_is_applied_from_its_start(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path, source: str
) -> None:
    topic = create_topic(bootstrap, unique("recreated"))
    old = orders(bootstrap, topic, 30)
    sink = PostgresSink("orders", url=db.raw)
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, source=source)
    assert table(pg) == old and ledger(pg) == {0: 30}

    recreate(bootstrap, topic)
    new = orders(bootstrap, topic, 40)  # a longer log than the checkpoint's offset 31
    # kafka_rc's check of the checkpoint's topic ids stops the query first; with Spark's source, the sink's.
    code = "KAFKA_RC_TOPIC_RECREATED" if source == "kafka_rc" else "SINK_TOPIC_RECREATED"
    with pytest.raises(
        StreamingQueryException, match=rf"\[{code}\] topic {topic} was deleted and created again"
    ):
        run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, source=source)
    assert table(pg) == old and ledger(pg) == {0: 30}, "nothing applied"

    # The remedy the line names. Spark's own source cannot tell the new topic from the old, and
    # would go on from its checkpoint's offset 31: it also needs a new checkpoint from the earliest.
    checkpoint = tmp_path / ("checkpoint" if source == "kafka_rc" else "new-checkpoint")
    run(spark, bootstrap, topic, checkpoint, sink, source=source, failOnDataLoss="false")
    assert table(pg) == old | new
    assert ledger(pg) == {0: 40}


def test_a_topic_the_query_no_longer_reads_stops_nothing_when_created_again(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """A sink moved from one topic to another keeps the old one's offsets in its ledger. That topic
    deleted and made again (its name reused) is none of this query's business: it stopped the sink
    at every batch (SINK_TOPIC_RECREATED). A query that reads it again is checked then."""
    old_topic, new_topic = create_topic(bootstrap, unique("left")), create_topic(bootstrap, unique("now"))
    old = orders(bootstrap, old_topic, 10)
    sink = PostgresSink("orders", url=db.raw)
    run(spark, bootstrap, old_topic, tmp_path / "old", sink)
    recreate(bootstrap, old_topic)
    new = orders(bootstrap, new_topic, 20)
    run(spark, bootstrap, new_topic, tmp_path / "new", sink)
    assert table(pg) == old | new
    with pytest.raises(StreamingQueryException, match=rf"\[SINK_TOPIC_RECREATED\] topic {old_topic} "):
        run(spark, bootstrap, old_topic, tmp_path / "again", sink)


def test_a_topic_created_again_under_a_unions_second_source_stops_the_query(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """The topics a union of Kafka sources reads are every source's, not the first one's: the second
    source's topic created again is still caught before its new records are skipped as applied."""
    first, second = create_topic(bootstrap, unique("first")), create_topic(bootstrap, unique("second"))
    applied = orders(bootstrap, first, 5) | orders(bootstrap, second, 30)
    sink = PostgresSink("orders", url=db.raw)

    def union_run(checkpoint: Path) -> None:
        both = stream(spark, bootstrap, first).unionByName(stream(spark, bootstrap, second))
        frame = parse_json(both, SCHEMA, key_column="event_id")
        query = sink.start(frame, str(checkpoint), trigger={"availableNow": True})
        query.awaitTermination()

    union_run(tmp_path / "checkpoint")
    assert table(pg) == applied
    recreate(bootstrap, second)
    orders(bootstrap, second, 40)
    with pytest.raises(StreamingQueryException, match=rf"\[SINK_TOPIC_RECREATED\] topic {second} "):
        union_run(tmp_path / "new-checkpoint")
    assert table(pg) == applied, "nothing of the new topic skipped, nothing applied"


def test_a_truncated_log_keeps_its_prefix_applied(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """A log that ends before the ledger (an unclean leader election) keeps its prefix, which the
    sink applied. With failOnDataLoss=false the sink deleted the partition's ledger row: until a
    batch of that partition wrote it again, a read from the earliest offset (the remedy for a lost
    checkpoint) applied the prefix again, its outbox events and dead letters a second time."""
    topic = create_topic(bootstrap, unique("truncated"), partitions=2)
    first = orders(bootstrap, topic, 30)  # partition 0: offsets 0-29, marker 30
    sink = PostgresSink("orders", url=db.raw)
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink)
    assert ledger(pg) == {0: 30}
    pg.execute(
        "UPDATE sink_progress SET next_offset = 1000 WHERE kafka_partition = 0"
    )  # what truncation leaves
    more = orders(bootstrap, topic, 5, partition=1)  # a batch, of partition 1 only
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, failOnDataLoss="false")
    assert ledger(pg) == {0: 31, 1: 5}, "partition 0 stands at its log's end"
    run(spark, bootstrap, topic, tmp_path / "new-checkpoint", sink)  # from the earliest offsets
    assert sink.last is not None and sink.last.fresh == 0, sink.last
    assert table(pg) == first | more


def test_records_deleted_before_they_were_read_stop_the_query_or_are_skipped(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("retained"))
    first = orders(bootstrap, topic, 20)  # offsets 0-19, marker 20
    sink = PostgresSink("orders", url=db.raw)
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink)
    second = orders(bootstrap, topic, 30)  # offsets 21-50, marker 51
    delete_records(bootstrap, topic, 36)  # records 21-35 were never read

    with pytest.raises(
        StreamingQueryException,
        match=rf"\[KAFKA_RC_OFFSETS_DELETED\] offsets 21-35 of {topic}-0 were deleted before they were read",
    ):
        run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, pollTimeoutMs="20000")
    assert table(pg) == first

    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, pollTimeoutMs="20000", failOnDataLoss="false")
    kept = {k: v for k, v in second.items() if v[0] >= 15}  # offsets 36-50: orders 15-29
    assert table(pg) == first | kept
    assert ledger(pg) == {0: 51}


def test_records_deleted_from_a_partition_added_between_batches_are_a_loss(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """A partition added while the query runs is read from its earliest offset. Retention that
    deleted its first records before a batch saw it (a long trigger interval, a query down) lost
    them without a word; Spark's own source says so, as for any partition."""
    topic = create_topic(bootstrap, unique("added"))
    first = orders(bootstrap, topic, 10)
    sink = PostgresSink("orders", url=db.raw)
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink)
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.create_partitions([NewPartitions(topic, 2)]).values():
        future.result(30)
    added = orders(bootstrap, topic, 20, partition=1)  # offsets 0-19, marker 20
    delete_records(bootstrap, topic, 5, partition=1)

    with pytest.raises(
        StreamingQueryException,
        match=rf"\[KAFKA_RC_OFFSETS_DELETED\] offsets 0-4 of {topic}-1 were deleted before they were read",
    ):
        run(spark, bootstrap, topic, tmp_path / "checkpoint", sink)
    assert table(pg) == first
    run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, failOnDataLoss="false")
    assert table(pg) == first | {k: v for k, v in added.items() if v[0] >= 5}


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_read_whose_start_retention_deleted_meanwhile(bootstrap: str, fail_on_data_loss: bool) -> None:
    """Retention between planning and reading: the task stops at once with the line, or skips what is gone."""
    topic = create_topic(bootstrap, unique("retained"))
    orders(bootstrap, topic, 30)  # offsets 0-29, marker 30
    delete_records(bootstrap, topic, 10)
    read = read_range(
        {"bootstrap.servers": bootstrap, "group.id": "t", "isolation.level": "read_committed"},
        Range(topic, 0, 4, 31),
        poll_timeout_s=20,
        fail_on_data_loss=fail_on_data_loss,
    )
    if fail_on_data_loss:
        with pytest.raises(DataLossError, match=f"{topic}-0: offset 4 is no longer on the broker") as caught:
            list(read)
        assert caught.value.code == "KAFKA_RC_OFFSET_GONE"
    else:
        assert [o for b in read for o in b.column("offset").to_pylist()] == list(range(10, 30))
