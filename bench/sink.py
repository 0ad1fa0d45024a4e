"""Throughput of the exactly-once PostgreSQL sink beside its limit and the writers users write, one run.

Produces N JSON events of ~SIZE bytes to Kafka, then writes the same events these ways:
  psycopg: no Spark, no Kafka: the rows already in memory, per batch Arrow-encoded
           CSV COPY into a temp table + one INSERT .. ON CONFLICT (the limit here);
  sink:    PostgresSink (upsert on event_id, ledger and offsets in the same transaction);
  jdbc:    foreachBatch DataFrame.write.jdbc(mode="append"): the peer users reach for
           (not idempotent), PostgreSQL JDBC driver fetched with Maven;
  hand:    foreachBatch + foreachPartition, psycopg COPY into a temp table + INSERT ..
           ON CONFLICT per task: the idempotent peer a user writes by hand (no ledger).
The three writers are fed the same rows twice: from Kafka through Spark's own Kafka
source (read_committed) -> parse_json, and from Parquet files holding the same typed
rows with their Kafka positions, one file per partition and micro-batch (the writer's
own path alone). From Kafka the sink applies in the tasks, and its tasks read their
offset ranges from Kafka themselves (sinks/postgres/direct.py): Spark reads no record of
it, and its progress counts none, so its rows are counted from its own results; a Parquet frame proves
nothing about where a topic-partition's rows are, so the sink's Parquet feed is
range-partitioned by topic and partition, as a user of such a frame would do, and
its cost is measured alone too; the peers are also fed that same frame
(jdbc_memory_ranged, hand_memory_ranged), where only the writers differ. Beside them:
  source:  Spark's Kafka source -> parse_json -> noop: the input with no writing at all;
           no writer fed by it can be faster;
  source_arrow: the same, handed to Python as Arrow (mapInArrow) as the sink's tasks get it;
  source_memory, source_memory_ranged: the Parquet feeds -> noop;
  source_memory_arrow: the sink's Parquet feed (by range) handed to Python as Arrow, dropped;
  sink_rc: the sink fed by kafka_rc instead, the framework's own source (read by the tasks too);
  tasks_read_kafka: not a writer this project has: the bare form of the sink's own design from
           Kafka, its ceiling. Spark hands it only each micro-batch's offset ranges (a file of
           them a batch); each task reads its range read_committed with confluent-kafka, parses the
           values with Arrow's JSON reader, and COPYs, upserts and moves a ledger row in one
           transaction: the bare apply (no dead letters, no fresh-row filter, no checks, no
           counts). What the sink costs beyond it is what its guarantees cost.
  sink_driver: the sink from Kafka with apply_in="driver", the staged path.
  sink_traced: the sink from Kafka with trace=True (each record's outcome recorded for
           `outbox trace`): what tracing costs, against `sink`.
  source_rf3, sink_rf3: the source alone and the sink, from the same events on a three-broker
           cluster (replication factor 3, min.insync.replicas 2): the cost of replication
           to the reader (--no-cluster leaves them out).
  sink_avro, jdbc_avro, hand_avro: the same events as Avro in Confluent's wire format, under a
           schema registry (Apicurio, or SCHEMA_REGISTRY_URL's): the sink through parse_avro
           (each value read with its writer schema, by id), against the peers as a Spark user
           feeds them today: Spark's own from_avro(substring(value, 6), the schema pinned)
           (the spark-avro jar); source_avro_arrow: that peer's frame handed to Python as
           Arrow and dropped; avro_decode: fastavro's decode of the same values in one
           process, the Python the sink spends per event (--no-avro leaves them out).
Where the time goes: the sink's tasks time each stage (sinks/postgres/clock.py: input, that is
the source, its decoding and Spark's Arrow; encode; COPY; the ledger's lock; the apply
statement; the commit) and the hand-written peer its own (input, COPY, upsert, commit); both
are printed per event, and the source runs say what the input costs without a writer.
Each run also says its steady batch's phases as Spark times them (durationMs: addBatch is the
writer, the rest the query's own) and the Spark JVM's garbage collection per row.
What the machine leaves the sink, from the same run: the ceiling (from Parquet its feed handed to
Python as Arrow and dropped; from Kafka, where its tasks read Kafka, tasks_read_kafka: no sink of
that design is faster) and the bound (the cores over that floor's CPU per row: the feed's plus
the bare COPY + upsert's, or tasks_read_kafka's own), each as a ratio to the peers; and that floor
at each peer's own share of the cores (alike_ratio_*: the peer's CPU per row over the floor's).
All runs use the same micro-batch size. Steady state excludes the first batch, for the rates
and the CPU alike. A range repartition reads each micro-batch twice (once to sample the
bounds), and Spark counts both reads as input rows: a run's rows are counted once, from the
events it holds. Each writer first runs once from Kafka unmeasured: the JVMs' first reads are
slower. CPU per row is machine-wide (bench/cpu.py): broker, PostgreSQL and Spark together.
Two runs of the same writer here differ by up to a quarter, so the compared runs (ROUNDED)
are measured in --rounds rounds into fresh tables; a ratio is the median of the rounds'
ratios, each of runs seconds apart, and a rate the median of its rounds. Five by default: in
three-round runs one slow round moved the median by a tenth.

    python bench/sink.py [--events 1000000] [--size 200] [--batches 5] [--rounds 5] [--no-cluster]
                         [--no-avro] [--no-warmup] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import flags  # bench/flags.py
import pyarrow as pa
from kafka_load import produce  # bench/kafka_load.py
from services import services  # bench/services.py
from sink_alone import avro_decode, psycopg_alone, trace_cost  # bench/sink_alone.py
from sink_inputs import avro_values, events, records, schema_registry, write_parquet, write_ranges
from sink_plan import SCHEMA, TABLE  # bench/sink_plan.py
from sink_report import report, unwritten  # bench/sink_report.py
from sink_run import Recorded, run, settle, stream  # bench/sink_run.py
from sink_spark import spark_runs  # bench/sink_spark.py

from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Cluster

# What bench/scale.py takes from this script (`from sink import ...`), now defined beside it.
__all__ = ["SCHEMA", "TABLE", "Recorded", "events", "run", "settle", "stream"]


def arguments() -> argparse.Namespace:
    """The flags every bench takes (bench/flags.py), and the sink bench's own."""
    parser = flags.parser(__doc__, events=1_000_000, size_help="JSON bytes per event", spark=True)
    parser.add_argument(
        "--cluster",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also read the events from a three-broker cluster, replication factor 3",
    )
    parser.add_argument(
        "--avro",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write the events as Avro under a schema registry: the sink's parse_avro and its peers",
    )
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first run each writer from Kafka once, unmeasured (the JVMs' first reads are slower)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds of the compared runs (the sink, its peers, its feed): ratios are the rounds' median",
    )
    return parser.parse_args()


def main() -> int:
    args = arguments()
    per_batch = -(-args.events // args.batches)

    with tempfile.TemporaryDirectory(prefix="bench-sink-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        with services(work / "services") as (url, bootstrap):
            rows = events(args.events, args.size)
            topic = f"bench.sink.{uuid.uuid4().hex[:8]}"
            produce(bootstrap, topic, records(rows), args.partitions)
            base = psycopg_alone(url, rows, per_batch)
            tracing = trace_cost(url, rows, per_batch)
            write_parquet(rows, topic, args.partitions, per_batch, work / "parquet")
            sizes = write_ranges(bootstrap, topic, args.batches, work / "ranges")
            runs, decode = measure_spark(args, url, bootstrap, topic, rows, work, per_batch, sizes)
    result = report(args, base, tracing, decode, runs)
    wrong = unwritten(runs, args)
    flags.finish("sink", result, args)
    return 1 if wrong else 0


def measure_spark(
    args: argparse.Namespace,
    url: DatabaseUrl,
    bootstrap: str,
    topic: str,
    rows: pa.Table,
    work: Path,
    per_batch: int,
    sizes: list[int],
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """The Avro topic and the three-broker cluster where asked (stopped after), then every Spark run:
    the runs, and fastavro's decode of the Avro values alone (empty without --avro)."""
    cluster = Cluster(work / "cluster", size=3) if args.cluster else None
    registry = contextlib.ExitStack()
    decode: dict[str, float] = {}
    try:
        avro = None
        if args.avro:
            url_of_registry = registry.enter_context(schema_registry(work / "registry"))
            avro = (f"{topic}.avro", url_of_registry)
            values = avro_values(rows, avro[0], url_of_registry)
            decode = avro_decode(values, url_of_registry)
            keys = (r.encode() for r in rows.column("event_id").to_pylist())
            produce(bootstrap, avro[0], zip(keys, values, strict=True), args.partitions)
        if cluster is not None:
            produce(cluster.bootstrap, topic, records(rows), args.partitions)
        runs = spark_runs(
            url,
            bootstrap,
            topic,
            args.events,
            work / "spark",
            per_batch,
            work / "parquet",
            args.partitions,
            cluster.bootstrap if cluster else None,
            args.rounds,
            args.warmup,
            work / "ranges",
            sizes,
            avro,
        )
    finally:
        registry.close()
        if cluster is not None:
            cluster.close()
    return runs, decode


if __name__ == "__main__":
    sys.exit(main())
