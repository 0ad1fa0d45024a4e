"""Where the sink applies, decided from the logical plans of real frames."""

from __future__ import annotations

from sinks.postgres.placement import choose, read_plan


def test_real_frames(spark) -> None:  # type: ignore[no-untyped-def]
    """The glue reads Spark's own plans: sources, options, repartitions, unions, joins."""
    from pyspark.sql import functions as F

    from sinks.postgres import parse_json

    def kafka(source: str = "kafka_rc", **options: str):  # type: ignore[no-untyped-def]
        raw = (
            spark.readStream.format(source)
            .option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "t")
            .options(**options)
            .load()
        )
        return parse_json(raw, "event_id string, n long", key_column="event_id")

    def tasks(frame) -> bool:  # type: ignore[no-untyped-def]
        return choose(*read_plan(frame), "auto").tasks

    static = spark.createDataFrame(
        [("a", 1, "t", 0, 0)], "event_id string, n long, topic string, partition int, offset long"
    )
    assert tasks(kafka())
    assert tasks(kafka("kafka"))
    assert tasks(kafka().filter("n > 0").coalesce(2))
    assert tasks(kafka().repartition(3, "topic", "partition"))
    assert tasks(static.coalesce(1))
    assert not tasks(kafka(minPartitions="4"))
    assert not tasks(kafka("kafka", minPartitions="4"))
    assert not tasks(kafka("kafka", maxRecordsPerPartition="10"))
    assert not tasks(kafka().repartition(3))
    assert not tasks(kafka().repartition(3, "event_id"))
    assert tasks(kafka().repartitionByRange(3, "topic", "partition"))
    assert not tasks(kafka().repartitionByRange(3, "n"))
    assert not tasks(kafka().repartitionByRange(3, F.col("partition") + 1))
    # Partitioned by a column that is no longer the one the sink reads as `partition`.
    assert not tasks(kafka().repartition(3, "partition").withColumn("partition", F.col("n").cast("int")))
    assert not tasks(kafka().union(kafka()))
    assert not tasks(kafka().join(static.select("n"), "n"))
    assert not tasks(static)
