"""Real frames, and where the sink must apply each: one list for classic Spark and Spark Connect."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sinks.postgres.placement import choose
from sinks.postgres.spark_plan import read_plan


def frames(spark: Any) -> list[tuple[str, Any, bool]]:
    """(what, frame, whether its batches may apply in the tasks) for sources, options, repartitions,
    renames, unions and joins."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from sinks.postgres import parse_json

    def kafka(source: str = "kafka_rc", **options: str) -> Any:
        raw = (
            spark.readStream.format(source)
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "t")
            .options(**options)
            .load()
        )
        return parse_json(raw, "event_id string, n long", key_column="event_id")

    static = spark.createDataFrame(
        [("a", 1, "t", 0, 0)], "event_id string, n long, topic string, partition int, offset long"
    )
    moved: Callable[[], Any] = lambda: kafka().repartition(3, "partition")  # noqa: E731
    return [
        ("kafka_rc", kafka(), True),
        ("Spark's kafka", kafka("kafka"), True),
        ("filter, coalesce", kafka().filter("n > 0").coalesce(2), True),
        ("by topic and partition", kafka().repartition(3, "topic", "partition"), True),
        ("a static frame in one partition", static.coalesce(1), True),
        ("kafka_rc minPartitions", kafka(minPartitions="4"), False),
        ("kafka minPartitions", kafka("kafka", minPartitions="4"), False),
        ("kafka maxRecordsPerPartition", kafka("kafka", maxRecordsPerPartition="10"), False),
        ("round robin", kafka().repartition(3), False),
        ("by event id", kafka().repartition(3, "event_id"), False),
        ("by range of topic and partition", kafka().repartitionByRange(3, "topic", "partition"), True),
        ("by range of n", kafka().repartitionByRange(3, "n"), False),
        ("by range of an expression", kafka().repartitionByRange(3, F.col("partition") + 1), False),
        # Partitioned by a column that is no longer the one the sink reads as `partition`.
        ("by a column replaced after", moved().withColumn("partition", F.col("n").cast("int")), False),
        ("a union", kafka().union(kafka()), False),
        ("a join", kafka().join(static.select("n"), "n"), False),
        ("a static frame", static, False),
        # A window is computed after a shuffle by its PARTITION BY: the sink's delete rule may hold one.
        (
            "a column over a window",
            kafka().withColumn("w", F.count("n").over(Window.partitionBy("n"))),
            False,
        ),
        ("a window in SQL", kafka().selectExpr("*", "count(n) OVER (PARTITION BY n) AS w"), False),
    ]


def routes(spark: Any) -> dict[str, bool]:
    """What the sink decides for each of `frames`: True where it applies in the tasks."""
    return {what: choose(*read_plan(frame), "auto").tasks for what, frame, _ in frames(spark)}


def expected(spark: Any) -> dict[str, bool]:
    return {what: tasks for what, _, tasks in frames(spark)}
