"""kafka_rc under failure: the driver killed -9 and restarted, a producer killed mid-transaction."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from tests.helpers import (
    Job,
    create_topic,
    produce_transaction,
    read_committed,
    transactional_producer,
    unique,
    wait_for,
)
from tests.source_support import records, stream_to_memory


def test_kill_9_of_the_driver_then_restart_continues_exactly(
    spark: SparkSession, bootstrap: str, tmp_path: Path
) -> None:
    name = create_topic(bootstrap, unique("crash"), partitions=2)
    producer = transactional_producer(bootstrap)
    for i in range(20):
        produce_transaction(producer, name, records(100, f"t{i}"))
    out, ckpt = tmp_path / "out", tmp_path / "checkpoint"
    args = ["-m", "tests.jobs.stream_to_parquet", bootstrap, name, str(out), str(ckpt)]

    first = Job([*args, str(tmp_path / "w1"), "150"], tmp_path / "first.log", {})
    first.wait_for_output("batch 3", timeout=180)
    first.kill9()

    # The restart in larger batches: the batch the kill left planned keeps its recorded range.
    second = Job([*args, str(tmp_path / "w2"), "500", "available-now"], tmp_path / "second.log", {})
    assert second.wait(timeout=300) == 0, second.output()
    assert "done" in second.output()

    # Spark's file sink lists only committed batches (its _spark_metadata log).
    rows = spark.read.parquet(str(out)).collect()
    positions = Counter((r.partition, r.offset) for r in rows)
    assert max(positions.values()) == 1, "a record was written twice"
    expected = {(p, o) for p, o, _, _ in read_committed(bootstrap, name, 2)}
    assert set(positions) == expected, "records missing"
    assert len(expected) == 2000


HUNG_PRODUCER = """
import sys, time
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[3],
                     "transaction.timeout.ms": 3000})
producer.init_transactions(30)
producer.begin_transaction()
for i in range(5):
    producer.produce(sys.argv[2], key=b"k", value=b"hung-%d" % i)
producer.flush(30)
print("open", flush=True)
time.sleep(3600)
"""


def test_a_producer_killed_mid_transaction_is_aborted_and_readers_move_past(
    spark: SparkSession, bootstrap: str, tmp_path: Path, checkpoint: Path
) -> None:
    """Killed with its transaction open and never re-initialised: the broker aborts it at its timeout.

    Until then the Last Stable Offset stays at the open transaction, so readers
    wait; once it is aborted they go on, and its records never show.
    """
    name = create_topic(bootstrap, unique("hung"), partitions=1)
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, name, records(3, "before"))
    hung = Job(["-c", HUNG_PRODUCER, bootstrap, name, unique("hung-tx")], tmp_path / "hung.log", {})
    hung.wait_for_output("open", 60)
    hung.kill9()
    produce_transaction(producer, name, records(3, "after"))  # behind the open transaction
    query, sink = stream_to_memory(spark, bootstrap, name, checkpoint, available_now=False)
    try:
        wait_for(lambda: spark.sql(f"select count(*) c from {sink}").first().c >= 6, 120, "the later commits")
        values = sorted(r.value for r in spark.sql(f"select value from {sink}").collect())
    finally:
        query.stop()
    assert values == sorted(v for _, v in records(3, "before") + records(3, "after"))
