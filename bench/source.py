"""Throughput of the kafka_rc source against a raw consumer and Spark's own Kafka source, in one run.

Produces N records of ~SIZE bytes, then reads the same topic with each reader:
  raw:    one read_committed confluent-kafka Consumer, consume() in batches,
          touching every key and value (the limit for a librdkafka reader);
  builtin: spark.readStream.format("kafka"), kafka.isolation.level=read_committed
          -> noop sink (the peer: Spark's JVM source, jars from Maven);
  source: spark.readStream.format("kafka_rc") -> noop sink, trigger availableNow,
          maxOffsetsPerTrigger splitting the run into micro-batches (both Spark readers);
  ceiling: a Python data source that yields ready-made Arrow batches of the
          same schema and size, same micro-batches, no Kafka at all: what Spark's
          Python data source path itself can ingest on this machine.
Steady state excludes the first micro-batch (session and Python worker start-up).

    python bench/source.py [--events 1000000] [--size 200] [--json]

Uses KAFKA_BOOTSTRAP_SERVERS if set, else starts the embedded Apache Kafka broker.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import flags  # bench/flags.py
from confluent_kafka import Consumer, TopicPartition
from cpu import busy_seconds, measured  # bench/cpu.py
from kafka_load import produce  # bench/kafka_load.py

from outbox.core.kafka import client_settings
from outbox_dev.stack import running


def raw_consumer(bootstrap: str, topic: str, events: int, partitions: int) -> float:
    consumer = Consumer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            },
            "consumer",
        )
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = size = 0
    start = time.perf_counter()
    while seen < events:
        for message in consumer.consume(5000, 1.0):
            if message.error() is None:
                value, key = message.value(), message.key()
                assert value is not None and key is not None  # produced above with both
                size += len(value) + len(key)
                seen += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return seen / elapsed


def spark_runs(
    bootstrap: str, topic: str, work: Path, events: int, size: int, per_batch: int
) -> dict[str, dict[str, float]]:
    """Spark's own Kafka source, kafka_rc, then the synthetic ceiling, in one SparkSession."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from outbox_dev.local_spark import kafka_connector_jars, local_session, stop_session
    from sinks.kafka_source import register
    from sinks.kafka_source.reader import ARROW_SCHEMA
    from sinks.kafka_source.source import SCHEMA

    class ReadyArrow(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def prepareForTriggerAvailableNow(self) -> None:
            """The end is fixed (`events`): nothing to record."""

        def initialOffset(self) -> dict:
            return {"i": 0}

        def latestOffset(self, start: dict, limit: object) -> dict:
            return {"i": min(events, start["i"] + per_batch)}

        def partitions(self, start: dict, end: dict) -> list[InputPartition]:
            mid = (start["i"] + end["i"]) // 2
            return [InputPartition((start["i"], mid)), InputPartition((mid, end["i"]))]

        def read(self, partition: InputPartition):  # type: ignore[no-untyped-def]
            import pyarrow as pa

            first, stop = partition.value
            rows = 50_000
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array([b"%07d" % i for i in range(rows)], pa.binary()),
                    pa.array([b"x" * size] * rows, pa.binary()),
                    pa.repeat(pa.scalar(topic, pa.string()), rows),
                    pa.repeat(pa.scalar(0, pa.int32()), rows),
                    pa.array(range(rows), pa.int64()),
                    pa.repeat(pa.scalar(0, pa.timestamp("us", tz="UTC")), rows),
                    pa.repeat(pa.scalar(0, pa.int32()), rows),
                    pa.ListArray.from_arrays(
                        pa.array([0] * (rows + 1), pa.int32()),
                        pa.array([], ARROW_SCHEMA.field("headers").type.value_type),
                    ),
                ],
                schema=ARROW_SCHEMA,
            )
            for at in range(first, stop, rows):
                yield batch.slice(0, min(rows, stop - at))

    class ReadyArrowSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_ready_arrow"

        def schema(self) -> str:
            return SCHEMA

        def streamReader(self, schema: object) -> DataSourceStreamReader:
            return ReadyArrow()

    spark = local_session(work, app_name="bench-source", jars=kafka_connector_jars())
    try:
        register(spark)
        spark.dataSource.register(ReadyArrowSource)

        def kafka(source: str):  # type: ignore[no-untyped-def]
            return (
                spark.readStream.format(source)
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(per_batch))
            )

        builtin = kafka("kafka").option("kafka.isolation.level", "read_committed").load()
        runs = {"builtin": run_to_noop(builtin, work / "checkpoint-builtin")}
        runs["source"] = run_to_noop(kafka("kafka_rc").load(), work / "checkpoint-source")
        ready = spark.readStream.format("bench_ready_arrow").load()
        runs["ceiling"] = run_to_noop(ready, work / "checkpoint-ceiling")
    finally:
        stop_session(spark)
    return runs


def run_to_noop(df, checkpoint: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Run to the end; steady state (rate and machine CPU) starts once the first micro-batch is done."""
    start = time.perf_counter()
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    first_done: float | None = None
    while not query.awaitTermination(0.05):
        if first_done is None and query.lastProgress is not None:
            first_done = busy_seconds()
    query.awaitTermination()  # raises what the query failed with
    total = time.perf_counter() - start
    cpu_end = busy_seconds()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = [b["numInputRows"] for b in batches]
    seconds = [b["durationMs"]["triggerExecution"] / 1000 for b in batches]
    steady_rows, steady_s = sum(rows[1:]), sum(seconds[1:])
    steady_cpu = None if first_done is None or cpu_end is None else cpu_end - first_done
    return {
        "rows": sum(rows),
        "batches": len(batches),
        "whole_run_per_s": sum(rows) / total,
        "steady_per_s": steady_rows / steady_s if steady_s else float("nan"),
        "steady_cpu_us_per_record": steady_cpu / steady_rows * 1e6 if steady_cpu and steady_rows else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> int:
    parser = flags.parser(__doc__, events=1_000_000, size_help="value bytes per record", spark=True)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-source-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        with running(work / "services", services=["kafka"]) as started:
            bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or started["KAFKA_BOOTSTRAP_SERVERS"]
            topic = f"bench.source.{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            payload = b"x" * args.size
            produce(
                bootstrap, topic, ((str(i).encode(), payload) for i in range(args.events)), args.partitions
            )
            produced_s = time.perf_counter() - t0
            raw, raw_usage = measured(lambda: raw_consumer(bootstrap, topic, args.events, args.partitions))
            per_batch = -(-args.events // args.batches)
            runs = spark_runs(bootstrap, topic, work / "spark", args.events, args.size, per_batch)
    builtin, source, ceiling = runs["builtin"], runs["source"], runs["ceiling"]
    cpu = {
        "raw": raw_usage.cpu_us_per(args.events),
        "builtin": builtin["steady_cpu_us_per_record"],
        "source": source["steady_cpu_us_per_record"],
        "ceiling": ceiling["steady_cpu_us_per_record"],
    }
    # A source does the raw consumer's work (librdkafka and the broker serving it) and then
    # Spark's (the ceiling's): on a full machine its rate cannot pass cores / the sum of both.
    bound = (
        (os.cpu_count() or 1) / (cpu["raw"] + cpu["ceiling"]) * 1e6 / raw
        if cpu["raw"] and cpu["ceiling"]
        else None
    )
    result = {
        "events": args.events,
        "value_bytes": args.size,
        "partitions": args.partitions,
        "produce_s": round(produced_s, 2),
        "raw_consumer_per_s": round(raw),
        "source_steady_per_s": round(source["steady_per_s"]),
        "source_whole_run_per_s": round(source["whole_run_per_s"]),
        "source_batches": source["batches"],
        "source_rows": source["rows"],
        "builtin_steady_per_s": round(builtin["steady_per_s"]),
        "builtin_whole_run_per_s": round(builtin["whole_run_per_s"]),
        "builtin_rows": builtin["rows"],
        "ratio_steady_vs_raw": round(source["steady_per_s"] / raw, 3),
        "ratio_steady_vs_builtin": round(source["steady_per_s"] / builtin["steady_per_s"], 3),
        "ratio_builtin_vs_raw": round(builtin["steady_per_s"] / raw, 3),
        "ceiling_steady_per_s": round(ceiling["steady_per_s"]),
        "ceiling_rows": ceiling["rows"],
        "ratio_source_vs_ceiling": round(source["steady_per_s"] / ceiling["steady_per_s"], 3),
        "ratio_ceiling_vs_raw": round(ceiling["steady_per_s"] / raw, 3),
        "machine_cpu_us_per_record": {name: _round(value) for name, value in cpu.items()},
        "raw_cores_busy": _round(raw_usage.cores_busy()),
        "ratio_bound_on_this_machine": _round(bound),
    }
    print(f"raw confluent-kafka consumer : {result['raw_consumer_per_s']:>10,} records/s")
    print(f"builtin kafka -> noop, steady: {result['builtin_steady_per_s']:>10,} records/s (Spark's source)")
    print(f"kafka_rc -> noop, steady     : {result['source_steady_per_s']:>10,} records/s")
    print(f"kafka_rc -> noop, whole run  : {result['source_whole_run_per_s']:>10,} records/s")
    print(f"ready Arrow -> noop, steady  : {result['ceiling_steady_per_s']:>10,} records/s (Spark's ceiling)")
    print(f"ratio kafka_rc / builtin     : {result['ratio_steady_vs_builtin']:>10}")
    print(f"ratio kafka_rc / raw         : {result['ratio_steady_vs_raw']:>10}")
    print(f"ratio builtin / raw          : {result['ratio_builtin_vs_raw']:>10}")
    print(f"ratio steady / ceiling       : {result['ratio_source_vs_ceiling']:>10}")
    print(f"ratio ceiling / raw          : {result['ratio_ceiling_vs_raw']:>10}")
    print(
        "machine CPU per record       : "
        + ", ".join(f"{name} {_round(value)} us" for name, value in cpu.items())
        + f" (steady; raw kept {_round(raw_usage.cores_busy())} of {os.cpu_count()} cores busy)"
    )
    print(f"bound on ratio steady / raw  : {_round(bound):>10} (cores / (raw + ceiling CPU per record))")
    short = {name: run["rows"] for name, run in (("kafka_rc", source), ("builtin", builtin))}
    short = {name: rows for name, rows in short.items() if rows != args.events}
    for name, rows in short.items():
        print(f"ERROR: {name} read {rows} rows, expected {args.events}", file=sys.stderr)
    flags.finish("source", result, args)
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
