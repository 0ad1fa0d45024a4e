"""The reading tasks' plan of a batch (sinks/postgres/direct.py, spark_plan.py): pure logic."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from pyspark.sql.datasource import InputPartition

from sinks.kafka_source.options import SourceOptions
from sinks.kafka_source.ranges import Range
from sinks.postgres.direct import DirectJob, Parse, for_batch
from sinks.postgres.spark_plan import _kafka_range
from sinks.postgres.task import TaskJob

PARSE = Parse(pa.schema([("id", pa.string())]), ("id",), True, None, True, True)
SOURCE = SourceOptions(bootstrap_servers="127.0.0.1:9092", topics=("t",))
JOB = DirectJob(TaskJob(stage=None, statements=None), PARSE, SOURCE, waits=True)  # type: ignore[arg-type]


def kafka(topic: str, partition: int, start: int, end: int, poll: int = 120_000, loss: bool = True):  # type: ignore[no-untyped-def]
    return ("kafka", (topic, partition, start, end, poll, loss))


def test_spark_sources_ranges_become_a_task_each_with_its_poll_timeout_and_data_loss_rule() -> None:
    job = for_batch(JOB, [kafka("t", 0, 5, 9, 3_000, False), kafka("t", 1, 0, 4, 3_000, False)], ("q", 7))
    assert job is not None
    assert job.tasks == ((Range("t", 0, 5, 9),), (Range("t", 1, 0, 4),))
    assert (job.source.poll_timeout_s, job.source.fail_on_data_loss, job.waits) == (3.0, False, False)
    assert job.task.after == ("q", 7)


def test_ranges_the_tasks_cannot_take_as_planned_leave_the_batch_to_spark() -> None:
    assert (
        for_batch(JOB, [kafka("t", 0, 0, 5), kafka("t", 0, 5, 9)], None) is None
    )  # one partition, two tasks
    assert for_batch(JOB, [kafka("t", 0, -2, 5)], None) is None  # an offset not resolved
    assert for_batch(JOB, [kafka("t", 0, 9, 5)], None) is None
    assert for_batch(JOB, [kafka("t", 0, 0, 5, 1_000), kafka("t", 1, 0, 5, 2_000)], None) is None
    python = ("python", pickle.dumps(InputPartition((Range("t", 0, 0, 5),))))
    assert for_batch(JOB, [kafka("t", 1, 0, 5), python], None) is None  # two kinds of source


def test_kafka_rcs_partitions_keep_their_packed_ranges_and_its_empty_task() -> None:
    packed = InputPartition((Range("a", 0, 0, 5), Range("b", 3, 7, 8)))
    planned = [("python", pickle.dumps(packed)), ("python", pickle.dumps(InputPartition(None)))]
    job = for_batch(JOB, planned, None)
    assert job is not None and job.waits
    assert job.tasks == ((Range("a", 0, 0, 5), Range("b", 3, 7, 8)), ())
    assert for_batch(JOB, [("python", pickle.dumps(InputPartition(("not a range",))))], None) is None


def test_a_partitions_range_is_read_from_its_text_whatever_its_settings_hold() -> None:
    text = (
        "Some(KafkaBatchInputPartition(KafkaOffsetRange(my.topic-a_1-12,0,19,None),"
        '{sasl.jaas.config=x required username="a,b" password="),9,true,false))",'
        " bootstrap.servers=127.0.0.1:1},120000,false,true))"
    )
    assert _kafka_range(text) == ("kafka", ("my.topic-a_1", 12, 0, 19, 120000, False))
    with pytest.raises(ValueError):
        _kafka_range("Some(KafkaBatchInputPartition(KafkaOffsetRange(t-0,0,1,None),{},120000,true))")
