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
                         [--no-avro] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from statistics import median
from typing import Any, cast

import flags  # bench/flags.py
import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from cpu import COMPONENTS, DRIVER, Mark, measured  # bench/cpu.py
from kafka_load import produce  # bench/kafka_load.py
from services import services  # bench/services.py

from outbox.core.config import DatabaseUrl
from outbox_dev.kafka import Cluster
from sinks.postgres.clock import STAGES

# The hand-written peer's stages: rows from Spark, COPY (row by row: encode and send), upsert, commit.
HAND_STAGES = ("input", "copy", "apply", "commit")
# tasks_read_kafka's: the range read from Kafka, its values parsed, encoded as CSV, COPY, apply, commit.
RANGE_STAGES = ("read", "parse", "encode", "copy", "apply", "commit")
SCHEMA = "event_id string, n long, amount decimal(12,2), note string"
ARROW_SCHEMA = pa.schema(
    [("event_id", pa.string()), ("n", pa.int64()), ("amount", pa.decimal128(12, 2)), ("note", pa.string())]
)
RANGES = "topic string, partition int, start long, end long"
TABLE = "CREATE TABLE {} (event_id uuid PRIMARY KEY, n bigint, amount numeric(12,2), note text)"
# The Spark runs that write, each to bench_<name>.
SINKS = ("sink", "sink_memory", "sink_rc", "sink_driver", "sink_traced", "sink_rf3", "sink_avro")
WRITERS = (
    "sink",
    "jdbc",
    "hand",
    "sink_memory",
    "jdbc_memory",
    "hand_memory",
    "jdbc_memory_ranged",
    "hand_memory_ranged",
    "sink_rc",
    "sink_driver",
    "sink_traced",
    "sink_rf3",
    "tasks_read_kafka",
    "sink_avro",
    "jdbc_avro",
    "hand_avro",
)
# The runs the targets compare, measured in --rounds rounds, by feed: the feed handed to Python as Arrow,
# then the writers of that feed, whose order turns by one each round. A round ran them in one order
# before, the sink first: in three one-round runs it cost 5-10 CPU us per event more in the Spark JVM
# than the same sink run later (tracing, on the driver), and in two kept runs of three its first
# round's ratio was the lowest; now each writer's place turns by one each round. The traced sink sat
# last, so that in four rounds of five it ran just before the untraced one, which then ran faster:
# 2026-11-29T051651Z-sink.json gave 1.1 the round it ran after it, 0.85-0.90 in the four others, while
# its tasks' stages were no slower. Two places apart, it runs first in two rounds of five, second in three.
COMPARED = (
    ("source_arrow", ("sink", "jdbc", "sink_traced", "hand", "tasks_read_kafka")),
    (
        "source_memory_arrow",
        ("sink_memory", "jdbc_memory", "hand_memory", "jdbc_memory_ranged", "hand_memory_ranged"),
    ),
    ("source_avro_arrow", ("sink_avro", "jdbc_avro", "hand_avro")),
)
ROUNDED = tuple(name for feed, writers in COMPARED for name in (feed, *writers))
# Each writer from Kafka runs once unmeasured first (the JVMs' first reads).
WARMED = (*COMPARED[0][1], *COMPARED[2][1])
# The Avro events' schema: SCHEMA's columns, as a producer with Confluent's serializer writes them.
AVRO_SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "note", "type": "string"},
    ],
}


def round_order(k: int, avro: bool = True) -> list[str]:
    """Round k's (from 0) runs: each feed, then its writers turned by k."""
    return [
        name
        for feed, writers in COMPARED
        if avro or feed != "source_avro_arrow"
        for name in (feed, *writers[k % len(writers) :], *writers[: k % len(writers)])
    ]


def events(count: int, size: int) -> pa.Table:
    note = "x" * max(0, size - 100)  # the JSON around it is ~100 bytes
    return pa.table(
        {
            "event_id": [str(uuid.UUID(int=i + 1)) for i in range(count)],
            "n": pa.array(range(count), pa.int64()),
            "amount": [f"{i % 100000 / 100:.2f}" for i in range(count)],
            "note": pa.repeat(pa.scalar(note), count),
        }
    )


def psycopg_alone(url: DatabaseUrl, rows: pa.Table, per_batch: int) -> dict[str, Any]:
    result, usage = measured(lambda: _psycopg_alone(url, rows, per_batch))
    return {
        **result,
        "cpu_us_per_row": usage.cpu_us_per(rows.num_rows) or float("nan"),
        "cpu_us_per_row_by": usage.components_us_per(rows.num_rows),
    }


def _psycopg_alone(url: DatabaseUrl, rows: pa.Table, per_batch: int) -> dict[str, float]:
    with psycopg.connect(url.libpq) as conn:
        conn.execute(TABLE.format("bench_psycopg"))
        conn.commit()
        seconds = []
        for start in range(0, rows.num_rows, per_batch):
            t0 = time.perf_counter()
            chunk = io.BytesIO()
            pacsv.write_csv(rows.slice(start, per_batch), chunk, pacsv.WriteOptions(include_header=False))
            conn.execute(
                "CREATE TEMP TABLE incoming (event_id uuid, n bigint, amount numeric(12,2), note text)"
                " ON COMMIT DROP"
            )
            with conn.cursor().copy("COPY incoming FROM STDIN (FORMAT csv)") as copy:
                copy.write(chunk.getvalue())
            conn.execute(
                "INSERT INTO bench_psycopg SELECT * FROM incoming ON CONFLICT (event_id) DO UPDATE"
                " SET n = EXCLUDED.n, amount = EXCLUDED.amount, note = EXCLUDED.note"
            )
            conn.commit()
            seconds.append(time.perf_counter() - t0)
        count = conn.execute("SELECT count(*) FROM bench_psycopg").fetchone()[0]  # type: ignore[index]
    sizes = [min(per_batch, rows.num_rows - s) for s in range(0, rows.num_rows, per_batch)]
    return {**figures(sizes, seconds), "written": count}


def trace_cost(url: DatabaseUrl, rows: pa.Table, per_batch: int, rounds: int = 5) -> dict[str, float]:
    """The sink's applying statement alone, without and with tracing, turn about on the same batches
    into fresh tables: microseconds per row, the medians. Two Spark runs differ by more than tracing
    costs on this machine; this isolates the statement tracing adds to."""
    from pyspark.sql import types as T

    from outbox import migrate
    from sinks.postgres.apply import apply_batch
    from sinks.postgres.catalog import describe
    from sinks.postgres.plan import plan
    from sinks.postgres.spec import SinkSpec
    from sinks.postgres.statements import Statements

    frame = T.StructType(
        [
            T.StructField("event_id", T.StringType()),
            T.StructField("n", T.LongType()),
            T.StructField("amount", T.StringType()),
            T.StructField("note", T.StringType()),
            T.StructField("topic", T.StringType()),
            T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
        ]
    )
    migrate.upgrade(url, "public")
    batch = rows.slice(0, per_batch).to_pylist()
    seconds: dict[bool, list[float]] = {False: [], True: []}
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        for n in range(rounds):
            for traced in (False, True):
                table = f"bench_trace_{n}_{int(traced)}"
                conn.execute(TABLE.format(table))
                conn.execute("DELETE FROM sink_progress WHERE sink = %s", [table])  # an earlier call's
                spec = SinkSpec(url=url, table=table, name=table, trace=traced)
                st = Statements(spec, plan(frame, describe(conn, "public", table), spec))
                conn.execute(st.create_stage())
                columns = "c0, c1, c2, c3, _topic, _partition, _offset, _delete, _attempt"
                with conn.cursor().copy(
                    f"COPY {st.names.stage.as_string(conn)} ({columns}) FROM STDIN"
                ) as copy:
                    for i, r in enumerate(batch):
                        copy.write_row((r["event_id"], r["n"], r["amount"], r["note"], "t", 0, i, False, 1))
                settle(url)
                t0 = time.perf_counter()
                apply_batch(conn, [st], 0, [1], len(batch))
                seconds[traced].append(time.perf_counter() - t0)
                conn.execute(f"DROP TABLE {table}")
    plain, traced_ = (sorted(seconds[k])[len(seconds[k]) // 2] / len(batch) * 1e6 for k in (False, True))
    return {"apply_us": plain, "apply_traced_us": traced_, "trace_us": traced_ - plain}


def figures(rows: list[int], seconds: list[float]) -> dict[str, float]:
    return {
        "rows": sum(rows),
        "batches": len(rows),
        "whole_run_per_s": sum(rows) / sum(seconds),
        "steady_per_s": sum(rows[1:]) / sum(seconds[1:]) if len(rows) > 1 else float("nan"),
    }


@contextlib.contextmanager
def schema_registry(folder: Path) -> Iterator[str]:
    """SCHEMA_REGISTRY_URL's registry, else the dev stack's (Apicurio), for the run: its URL."""
    given = os.environ.get("SCHEMA_REGISTRY_URL")
    if given:
        yield given
        return
    from outbox_dev import registry
    from outbox_dev.process import free_port, stop

    service = registry.start(folder, free_port(), die_with_parent=True)
    try:
        yield service.env[registry.SCHEMA_REGISTRY_URL]
    finally:
        stop(service.pid)


def avro_values(rows: pa.Table, topic: str, registry: str) -> list[bytes]:
    """The rows as Confluent's Avro serializer frames them, under the topic's value subject."""
    from confluent_kafka.schema_registry import Schema
    from fastavro import parse_schema, schemaless_writer

    from outbox.core.registry import Registry
    from outbox.core.wire import frame

    schema = Schema(json.dumps(AVRO_SCHEMA), "AVRO")
    schema_id = Registry.of(registry).ask(lambda c: c.register_schema(f"{topic}-value", schema))
    parsed = parse_schema(AVRO_SCHEMA)
    values = []
    for row in rows.to_pylist():
        body = io.BytesIO()
        schemaless_writer(body, parsed, {**row, "amount": Decimal(row["amount"])})
        values.append(frame(schema_id, body.getvalue()))
    return values


def avro_decode(values: list[bytes], registry: str) -> dict[str, float]:
    """What parse_avro's decoding costs, alone: the values read in one process as its tasks read
    them (sinks/postgres/avro.py), writer schema fetched once; microseconds per event."""
    from outbox.core.registry import Registry
    from sinks.postgres.avro import AvroValues

    read = AvroValues(AVRO_SCHEMA).reader_in(Registry.of(registry))
    framed = cast("list[bytes | None]", values)  # read takes tombstones too; it only reads the list
    read(framed[:1])  # the writer schema, fetched once
    began, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(framed), 10_000):
        read(framed[start : start + 10_000])
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    return {"wall_us": wall / len(values) * 1e6, "cpu_us": cpu / len(values) * 1e6}


def write_parquet(rows: pa.Table, topic: str, partitions: int, per_batch: int, folder: Path) -> None:
    """The rows with the Kafka positions `produce` gave them, as Parquet files a micro-batch reads.

    Each micro-batch is one file per Kafka partition, so Spark splits it into as
    many tasks as it does the same rows from Kafka.
    """
    i = np.arange(rows.num_rows)
    rows = (
        rows.set_column(2, "amount", pc.cast(rows["amount"], pa.decimal128(12, 2)))
        .append_column("topic", pa.repeat(pa.scalar(topic), rows.num_rows))
        .append_column("partition", pa.array(i % partitions, pa.int32()))
        .append_column("offset", pa.array(i // partitions, pa.int64()))
    )
    folder.mkdir()
    for k, start in enumerate(range(0, rows.num_rows, per_batch)):
        batch = rows.slice(start, per_batch)
        for p in range(partitions):
            part = batch.filter(pc.equal(batch["partition"], p))
            pq.write_table(part, folder / f"batch-{k:05d}-partition-{p:05d}.parquet")


def write_ranges(bootstrap: str, topic: str, batches: int, folder: Path) -> list[int]:
    """Each partition of `topic` cut into `batches` offset ranges, one JSON file a micro-batch reads;
    the events each batch holds. The topic was written without transactions: its offsets run on."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ranges"})
    try:
        count = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(count)]
    finally:
        consumer.close()
    folder.mkdir()
    sizes = []
    for k in range(batches):
        cut = [(p, end * k // batches, end * (k + 1) // batches) for p, end in enumerate(ends)]
        lines = [json.dumps({"topic": topic, "partition": p, "start": a, "end": b}) for p, a, b in cut]
        path = folder / f"batch-{k:05d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (k + 1, k + 1))  # the file source reads in modification order
        sizes.append(sum(b - a for _, a, b in cut))
    return sizes


def spark_runs(
    url: DatabaseUrl,
    bootstrap: str,
    topic: str,
    total: int,
    work: Path,
    per_batch: int,
    parquet: Path,
    partitions: int,
    replicated: str | None,
    rounds: int,
    ranges: Path,
    sizes: list[int],
    avro: tuple[str, str] | None,
) -> dict[str, dict[str, Any]]:
    """Every Spark run, in one SparkSession: from Kafka, then from Parquet, each of `total` rows.

    replicated: the servers of the RF 3 cluster holding the same topic, or None.
    ranges: the files of the topic's offset ranges (write_ranges), `sizes` the events of each.
    avro: the topic holding the same events as Avro, and the registry's URL; or None."""
    from outbox_dev.jvm import maven
    from outbox_dev.local_spark import kafka_connector_jars, local_session, stop_session
    from sinks.kafka_source import register
    from sinks.postgres import PostgresSink, parse_avro, parse_json

    jdbc_driver = maven.jars("postgres-jdbc", what="the PostgreSQL JDBC driver (the JDBC peer)")
    spark_avro = maven.jars("spark-avro", what="Spark's Avro functions (the Avro peers)") if avro else []
    jars = [*kafka_connector_jars(), *jdbc_driver, *spark_avro]
    spark = local_session(work, app_name="bench-sink", jars=jars)
    try:
        register(spark)

        def kafka(source: str = "kafka", servers: str = bootstrap):  # type: ignore[no-untyped-def]
            return parse_json(stream(spark, source, servers, topic, per_batch), SCHEMA, key_column="event_id")

        def avro_sink_feed():  # type: ignore[no-untyped-def]
            assert avro is not None
            return parse_avro(
                stream(spark, "kafka", bootstrap, avro[0], per_batch), avro[1], key_column="event_id"
            )

        def avro_peer_feed():  # type: ignore[no-untyped-def]
            """As a Spark user reads Confluent's framing today: five bytes cut off, one schema pinned."""
            from pyspark.sql import functions as F
            from pyspark.sql.avro.functions import from_avro

            assert avro is not None
            raw = stream(spark, "kafka", bootstrap, avro[0], per_batch)
            body = F.expr("substring(value, 6)")
            return raw.select(from_avro(body, json.dumps(AVRO_SCHEMA)).alias("e")).select("e.*")

        def memory():  # type: ignore[no-untyped-def]
            typed = f"{SCHEMA}, topic string, partition int, offset long"
            return (
                spark.readStream.schema(typed).option("maxFilesPerTrigger", partitions).parquet(str(parquet))
            )

        def ranged():  # type: ignore[no-untyped-def]
            return memory().repartitionByRange(partitions, "topic", "partition")

        sinks: dict[str, Recorded] = {}

        def sink(table: str, frame, apply_in: str = "auto", trace: bool = False):  # type: ignore[no-untyped-def]
            made = PostgresSink(table, url=url.raw, name=table, apply_in=apply_in, trace=trace)  # type: ignore[arg-type]
            sinks[table] = Recorded(made.writer(frame))
            return sinks[table]

        def noop(batch, _: int) -> None:  # type: ignore[no-untyped-def]
            batch.write.format("noop").mode("append").save()

        # stringtype=unspecified lets PostgreSQL turn the event id string into uuid.
        jdbc_url = f"jdbc:postgresql://{url.raw.split('@', 1)[1]}?stringtype=unspecified"
        user = url.raw.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]

        def jdbc(table: str, _frame):  # type: ignore[no-untyped-def]
            def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
                batch.select("event_id", "n", "amount", "note").write.jdbc(
                    jdbc_url,
                    table,
                    mode="append",
                    properties={"user": user, "driver": "org.postgresql.Driver"},
                )

            return each

        clocks: dict[str, dict[str, Any]] = {}

        def hand(table: str, _frame):  # type: ignore[no-untyped-def]
            clock = clocks[table] = {stage: spark.sparkContext.accumulator(0.0) for stage in HAND_STAGES}
            return hand_written_upsert(url.libpq, table, clock)

        def offsets():  # type: ignore[no-untyped-def]
            return spark.readStream.schema(RANGES).option("maxFilesPerTrigger", 1).json(str(ranges))

        def read_kafka(table: str, _frame):  # type: ignore[no-untyped-def]
            clock = clocks[table] = {stage: spark.sparkContext.accumulator(0.0) for stage in RANGE_STAGES}
            return tasks_read_kafka(url.libpq, bootstrap, table, partitions, clock)

        def to_arrow(batch, _: int) -> None:  # type: ignore[no-untyped-def]
            """The rows handed to Python as Arrow, as the sink's tasks get them, and dropped."""
            batch.mapInArrow(lambda batches: (b.slice(0, 0) for b in batches), batch.schema).write.format(
                "noop"
            ).mode("append").save()

        def fixed(each: Callable) -> Callable:  # the runs that write nothing: each table the same
            return lambda _table, _frame: each

        # Every measured run, in the order they run: its feed, and what makes its writer for a table.
        plan: dict[str, tuple[Callable, Callable]] = {
            "source": (kafka, fixed(noop)),
            "source_arrow": (kafka, fixed(to_arrow)),
            "source_memory": (memory, fixed(noop)),
            "source_memory_ranged": (ranged, fixed(noop)),
            "source_memory_arrow": (ranged, fixed(to_arrow)),
            "sink": (kafka, sink),
            "jdbc": (kafka, jdbc),
            "hand": (kafka, hand),
            "sink_memory": (ranged, sink),
            "jdbc_memory": (memory, jdbc),
            "hand_memory": (memory, hand),
            "jdbc_memory_ranged": (ranged, jdbc),  # the peers on the sink's own Parquet feed
            "hand_memory_ranged": (ranged, hand),
            "sink_traced": (kafka, lambda table, frame: sink(table, frame, trace=True)),
            "sink_rc": (lambda: kafka("kafka_rc"), sink),
            "sink_driver": (kafka, lambda table, frame: sink(table, frame, "driver")),
            "tasks_read_kafka": (offsets, read_kafka),
        }
        if avro is not None:
            plan["source_avro_arrow"] = (avro_peer_feed, fixed(to_arrow))
            plan["sink_avro"] = (avro_sink_feed, sink)
            plan["jdbc_avro"] = (avro_peer_feed, jdbc)
            plan["hand_avro"] = (avro_peer_feed, hand)
        if replicated is not None:
            plan["source_rf3"] = (lambda: kafka(servers=replicated), fixed(noop))
            plan["sink_rf3"] = (lambda: kafka(servers=replicated), sink)
        again = [f"bench_{n}_{k}" for n in ROUNDED if n in WRITERS for k in range(2, rounds + 1)]
        tables = [*(f"bench_{n}" for n in WRITERS), *again]
        warmed = [w for w in WARMED if w in plan]
        with psycopg.connect(url.libpq, autocommit=True) as conn:
            for table in (*tables, *(f"bench_warm_{w}" for w in warmed)):
                conn.execute(TABLE.format(table))
            conn.execute(
                "CREATE TABLE bench_ledger (tbl text, p int, next_offset bigint, PRIMARY KEY (tbl, p))"
            )
            conn.execute(
                "INSERT INTO bench_ledger SELECT t, p, 0"
                " FROM unnest(%s::text[]) AS t, generate_series(0, %s) AS p",
                [[*tables, "bench_warm_tasks_read_kafka"], partitions - 1],
            )

        def measure(name: str, table: str) -> dict:
            feed, make = plan[name]
            events = feed()
            each = make(table, events)
            settle(url)
            counted: list[int] | Callable[[], list[int]] | None = sizes if feed is offsets else None
            if table in sinks:
                counted = sinks[table].sizes or counted
            result = run(events, each, work / f"chk-{table}", total, counted)
            if name in WRITERS:
                result["written"] = count(url, table)
            return result

        # The broker's and Spark's JVMs are slower on their first reads of a topic (JIT): one unreported
        # pass of each writer from Kafka first, so that no measured run pays for coming first.
        for writer in warmed:
            measure(writer, f"bench_warm_{writer}")
        runs = {name: measure(name, f"bench_{name}") for name in plan if name not in ROUNDED}
        # The compared runs, round after round, each into fresh tables: two runs here differ by up to
        # a quarter, and a ratio is taken within a round, of runs a few seconds apart.
        for k in range(rounds):
            for name in round_order(k, avro is not None):
                result = measure(name, f"bench_{name}" if k == 0 else f"bench_{name}_{k + 1}")
                if k == 0:
                    runs[name] = {**result, "rounds": [result]}
                else:
                    runs[name]["rounds"].append(result)
        for name in (n for n in ROUNDED if n in runs):  # a compared run's figures: its rounds' median
            each = runs[name]["rounds"]
            runs[name]["steady_per_s"] = median([r["steady_per_s"] for r in each])
            runs[name]["cpu_us_per_row"] = median([r["cpu_us_per_row"] for r in each])
            by = {c for r in each for c in r["cpu_us_per_row_by"]}
            runs[name]["cpu_us_per_row_by"] = {
                c: round(median([r["cpu_us_per_row_by"].get(c, 0.0) for r in each]), 1) for c in sorted(by)
            }
        for table, recorded in sinks.items():
            name = table.removeprefix("bench_")
            if name not in runs:
                continue  # the warm-up
            writer, batches = recorded.writer, recorded.results
            reads = "; its tasks read Kafka themselves" if writer.reads_kafka else ""
            runs[name]["route"] = str(writer.route) + reads
            runs[name]["batches_detail"] = [
                {"rows": b.staged, "stage_s": round(b.stage_seconds, 3), "apply_s": round(b.apply_seconds, 3)}
                for b in batches
            ]
            # Steady batches only, as the rates are: task seconds per stage over their rows.
            steady = batches[1:] or batches
            rows = sum(b.staged for b in steady) or 1
            runs[name]["stages_us"] = {
                stage: sum(b.stages.get(stage, 0.0) for b in steady) / rows * 1e6 for stage in STAGES
            }
        for table, clock in clocks.items():
            name = table.removeprefix("bench_")
            if name in runs:  # the whole run, first batch included: accumulators do not say per batch
                runs[name]["stages_us"] = {
                    s: a.value / runs[name]["rows_all"] * 1e6 for s, a in clock.items()
                }
    finally:
        stop_session(spark)
    return runs


def stream(spark, source: str, servers: str, topic: str, per_batch: int):  # type: ignore[no-untyped-def]
    """`topic` from its start, `per_batch` records a micro-batch, through Spark's Kafka source
    (read_committed) or kafka_rc (which reads committed records only)."""
    frame = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
    )
    if source == "kafka":
        frame = frame.option("kafka.isolation.level", "read_committed")
    return frame.load()


class Recorded:
    """A sink's batch function that keeps each batch's result."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.results: list[Any] = []

    def __call__(self, batch: Any, batch_id: int) -> None:
        self.writer(batch, batch_id)
        self.results.append(self.writer.last)

    @property
    def sizes(self) -> Callable[[], list[int]] | None:
        """Each batch's events where the sink's tasks read Kafka themselves: Spark's progress counts
        no input row of such a batch (docs/sink.md)."""
        if self.writer.reads_kafka is None:
            return None
        return lambda: [r.staged for r in self.results]


def settle(url: DatabaseUrl) -> None:
    """Let PostgreSQL finish the last run's leftovers (vacuum, dirty pages) before the next run starts,
    so that no writer's CPU figure pays for the one before it."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def hand_written_upsert(libpq: str, table: str, clock: dict[str, Any]) -> Callable:
    """foreachBatch as users write it by hand: each task COPYs its rows, then upserts them.

    clock: a Spark accumulator per stage (HAND_STAGES), which its tasks add their seconds to.
    The rows are taken from Spark before the COPY, so that the source's share can be told apart.
    """

    def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        def task(rows) -> None:  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            rows = list(rows)
            t1 = time.perf_counter()
            with psycopg.connect(libpq) as conn:
                conn.execute(
                    "CREATE TEMP TABLE incoming (event_id uuid, n bigint, amount numeric(12,2), note text)"
                    " ON COMMIT DROP"
                )
                with conn.cursor().copy("COPY incoming FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
                t2 = time.perf_counter()
                conn.execute(
                    f"INSERT INTO {table} SELECT * FROM incoming ON CONFLICT (event_id) DO UPDATE"
                    " SET n = EXCLUDED.n, amount = EXCLUDED.amount, note = EXCLUDED.note"
                )
                t3 = time.perf_counter()
                conn.commit()
            laps = (t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3)
            for stage, seconds in zip(HAND_STAGES, laps, strict=True):
                clock[stage].add(seconds)

        batch.select("event_id", "n", "amount", "note").foreachPartition(task)

    return each


def tasks_read_kafka(libpq: str, bootstrap: str, table: str, tasks: int, clock: dict[str, Any]) -> Callable:
    """foreachBatch over a frame of offset ranges: each of `tasks` tasks reads its ranges from Kafka
    and applies each in a transaction.

    clock: a Spark accumulator per stage (RANGE_STAGES), which the tasks add their seconds to.
    """

    def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        def task(ranges) -> None:  # type: ignore[no-untyped-def]
            from confluent_kafka import Consumer, TopicPartition
            from pyarrow import json as pajson

            for r in ranges:
                laps = [time.perf_counter()]
                consumer = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": "bench-tasks",
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "fetch.max.bytes": 50_000_000,
                        "max.partition.fetch.bytes": 10_000_000,
                    }
                )
                consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
                values: list[bytes] = []
                last = r.start - 1
                # consume(n, t) waits for n records or for t: it asks for no more than are left. The
                # bench's topic has no transactions, so its offsets run on: a range read to its end.
                while last < r.end - 1:
                    got = consumer.consume(min(10_000, r.end - 1 - last), 10.0)
                    if not got:
                        raise RuntimeError(f"{r.topic}-{r.partition}: nothing after offset {last} in 10 s")
                    for m in got:
                        if m.error() is None and m.offset() < r.end:
                            value = m.value()
                            assert value is not None  # the bench wrote each record with a value
                            values.append(value)
                            last = m.offset()
                consumer.close()
                laps.append(time.perf_counter())
                parsed = pajson.read_json(
                    io.BytesIO(b"\n".join(values)),
                    parse_options=pajson.ParseOptions(explicit_schema=ARROW_SCHEMA),
                )
                laps.append(time.perf_counter())
                data = io.BytesIO()
                pacsv.write_csv(parsed, data, pacsv.WriteOptions(include_header=False))
                laps.append(time.perf_counter())
                with psycopg.connect(libpq) as conn:
                    conn.execute(
                        "CREATE TEMP TABLE incoming"
                        " (event_id uuid, n bigint, amount numeric(12,2), note text) ON COMMIT DROP"
                    )
                    conn.execute(
                        "SELECT next_offset FROM bench_ledger WHERE tbl = %s AND p = %s FOR UPDATE",
                        [table, r.partition],
                    )
                    with conn.cursor().copy("COPY incoming FROM STDIN (FORMAT csv)") as copy:
                        copy.write(data.getvalue())
                    laps.append(time.perf_counter())
                    conn.execute(
                        f"INSERT INTO {table} SELECT * FROM incoming ON CONFLICT (event_id) DO UPDATE"
                        " SET n = EXCLUDED.n, amount = EXCLUDED.amount, note = EXCLUDED.note"
                    )
                    conn.execute(
                        "UPDATE bench_ledger SET next_offset = %s WHERE tbl = %s AND p = %s",
                        [r.end, table, r.partition],
                    )
                    laps.append(time.perf_counter())
                    conn.commit()
                laps.append(time.perf_counter())
                for stage, (a, b) in zip(RANGE_STAGES, itertools.pairwise(laps), strict=True):
                    clock[stage].add(b - a)

        batch.repartition(tasks).foreachPartition(task)

    return each


def run(  # type: ignore[no-untyped-def]
    frame,
    each_batch: Callable,
    checkpoint: Path,
    total: int,
    sizes: list[int] | Callable[[], list[int]] | None = None,
) -> dict:
    """Stream `frame` (which holds `total` records) through `each_batch`, timed and measured.

    sizes: the events each batch holds, where Spark's progress does not count them: a frame of offset
    ranges, or a sink whose tasks read Kafka themselves (known once the run is over: a callable).

    Spark counts a source's rows once per read: a range repartition reads each
    micro-batch twice, once to sample the ranges' bounds, so its numInputRows is
    twice the rows. A batch's rows are its share of `total`, each counted once.
    CPU is counted as the steady rate is, without the first batch: from the end
    of its work to the end of the last batch's (the query's start, planning and
    first job cost some CPU-seconds, and would weigh on a short run's figure).
    """
    marks: list[Mark] = []
    collected: list[float] = []  # the JVM's garbage collection seconds so far, at each mark

    def each(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        each_batch(batch, batch_id)
        marks.append(Mark.now())
        collected.append(gc_seconds(frame.sparkSession))

    def go():  # type: ignore[no-untyped-def]
        query = (
            frame.writeStream.foreachBatch(each)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return query

    query, usage = measured(go)
    given = sizes() if callable(sizes) else sizes
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0 or given is not None]
    assert given is None or len(given) == len(batches), (given, len(batches))
    reads = sum(b["numInputRows"] for b in batches) / total if given is None else 1
    rows = [round(b["numInputRows"] / reads) for b in batches] if given is None else given
    result: dict[str, Any] = figures(rows, [b["durationMs"]["triggerExecution"] / 1000 for b in batches])
    result["batches"] = len(batches)
    # Spark's own phases of a steady batch, median ms: addBatch is the writer (its tasks and its own
    # driver work); the rest of triggerExecution is the query's (offsets, planning, the logs).
    steady_batches = batches[1:] or batches
    result["phases_ms"] = {
        phase: round(median(b["durationMs"].get(phase, 0) for b in steady_batches))
        for phase in sorted({k for b in steady_batches for k in b["durationMs"]})
    }
    result["source_reads"] = round(reads, 2)
    result["whole_run_per_s"] = sum(rows) / usage.wall_s
    result["rows_all"] = sum(rows)
    counted, steady = (sum(rows[1:]), marks[-1].since(marks[0])) if len(marks) > 1 else (sum(rows), usage)
    result["cpu_us_per_row"] = steady.cpu_us_per(counted) or float("nan")
    result["cpu_us_per_row_by"] = steady.components_us_per(counted)
    result["gc_us_per_row"] = (collected[-1] - collected[0]) / counted * 1e6 if len(collected) > 1 else 0.0
    return result


def gc_seconds(spark) -> float:  # type: ignore[no-untyped-def]
    """The Spark JVM's garbage collection time so far, all collectors (local mode: driver and tasks)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return sum(max(0, bean.getCollectionTime()) for bean in beans) / 1000


def count(url: DatabaseUrl, table: str) -> int:
    with psycopg.connect(url.libpq) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]


def main() -> int:
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
        "--rounds",
        type=int,
        default=5,
        help="rounds of the compared runs (the sink, its peers, its feed): ratios are the rounds' median",
    )
    args = parser.parse_args()
    per_batch = -(-args.events // args.batches)

    with tempfile.TemporaryDirectory(prefix="bench-sink-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        with services(work / "services") as (url, bootstrap):
            rows = events(args.events, args.size)
            topic = f"bench.sink.{uuid.uuid4().hex[:8]}"

            def records():  # type: ignore[no-untyped-def]
                return ((r["event_id"].encode(), json.dumps(r).encode()) for r in rows.to_pylist())

            produce(bootstrap, topic, records(), args.partitions)
            base = psycopg_alone(url, rows, per_batch)
            tracing = trace_cost(url, rows, per_batch)
            write_parquet(rows, topic, args.partitions, per_batch, work / "parquet")
            sizes = write_ranges(bootstrap, topic, args.batches, work / "ranges")
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
                    produce(cluster.bootstrap, topic, records(), args.partitions)
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
                    work / "ranges",
                    sizes,
                    avro,
                )
            finally:
                registry.close()
                if cluster is not None:
                    cluster.close()

    def steady(name: str) -> float:
        return runs[name]["steady_per_s"]

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3)

    spread: dict[str, list[float]] = {}  # a ratio's value in each round, where there were rounds

    def across(names: Sequence[str], figure: Callable[..., float], key: str) -> float:
        """`figure` of the named runs' results, in each round (a run measured once stands in every
        round): the median, its rounds kept under `key`."""
        each = [runs[n].get("rounds", [runs[n]]) for n in names]
        count = max(len(e) for e in each)
        padded = [e if len(e) == count else e * count for e in each]
        values = [figure(*results) for results in zip(*padded, strict=True)]
        if count > 1 and all(len(e) == count for e in each):
            spread[key] = [round(v, 3) for v in values]
        return round(median(values), 3)

    def paired(a: str, b: str, key: str | None = None) -> float:
        """a's steady rate over b's, within each round (its rounds kept under `key`)."""
        key = key or f"ratio_{a}_vs_{b}"
        return across((a, b), lambda x, y: x["steady_per_s"] / y["steady_per_s"], key)

    limit = base["steady_per_s"]
    result: dict[str, object] = {
        "events": args.events,
        "event_bytes": args.size,
        "batches": args.batches,
        "psycopg_steady_per_s": round(limit),
        "psycopg_whole_run_per_s": round(base["whole_run_per_s"]),
        "psycopg_cpu_us_per_row": round(base["cpu_us_per_row"], 1),
        **{f"{name}_steady_per_s": round(steady(name)) for name in runs},
        **{f"{name}_cpu_us_per_row": round(runs[name]["cpu_us_per_row"], 1) for name in runs},
        "sink_whole_run_per_s": round(runs["sink"]["whole_run_per_s"]),
        "ratio_sink_vs_psycopg": ratio(steady("sink"), limit),
        "ratio_source_alone_vs_psycopg": ratio(steady("source"), limit),
        "ratio_sink_vs_jdbc": paired("sink", "jdbc"),
        "ratio_sink_vs_hand": paired("sink", "hand"),
        "ratio_sink_memory_vs_psycopg": ratio(steady("sink_memory"), limit),
        "ratio_sink_memory_vs_jdbc_memory": paired("sink_memory", "jdbc_memory"),
        "ratio_sink_memory_vs_hand_memory": paired("sink_memory", "hand_memory"),
        "ratio_sink_memory_vs_jdbc_memory_ranged": paired("sink_memory", "jdbc_memory_ranged"),
        "ratio_sink_memory_vs_hand_memory_ranged": paired("sink_memory", "hand_memory_ranged"),
        "ratio_sink_rc_vs_sink": paired("sink_rc", "sink"),
        "ratio_tasks_read_kafka_vs_jdbc": paired("tasks_read_kafka", "jdbc"),
        "ratio_tasks_read_kafka_vs_hand": paired("tasks_read_kafka", "hand"),
        "ratio_sink_vs_tasks_read_kafka": paired("sink", "tasks_read_kafka"),
        "ratio_sink_vs_sink_driver": paired("sink", "sink_driver"),
        "ratio_sink_traced_vs_sink": paired("sink_traced", "sink"),
        "sink_batches": {n: runs[n]["batches_detail"] for n in SINKS if n in runs},
        "sink_routes": {n: runs[n]["route"] for n in SINKS if n in runs},
    }
    if "sink_rf3" in runs:
        result["ratio_source_rf3_vs_1"] = paired("source_rf3", "source")
        result["ratio_sink_rf3_vs_1"] = paired("sink_rf3", "sink")
    if "sink_avro" in runs:
        result["ratio_sink_avro_vs_jdbc"] = paired("sink_avro", "jdbc_avro", "ratio_sink_avro_vs_jdbc")
        result["ratio_sink_avro_vs_hand"] = paired("sink_avro", "hand_avro", "ratio_sink_avro_vs_hand")
        result["ratio_sink_avro_vs_sink"] = paired("sink_avro", "sink")
        result["avro_decode_us_per_event"] = {k: round(v, 2) for k, v in decode.items()}
    lines = [
        ("psycopg COPY + upsert (the limit)", "psycopg", limit),
        ("from Kafka: source alone, no writes", "source", steady("source")),
        ("from Kafka: PostgresSink, in the tasks", "sink", steady("sink")),
        ("from Kafka: PostgresSink, on the driver", "sink_driver", steady("sink_driver")),
        ("from Kafka: PostgresSink, tracing", "sink_traced", steady("sink_traced")),
        ("from Kafka: JDBC append", "jdbc", steady("jdbc")),
        ("from Kafka: hand-written upsert", "hand", steady("hand")),
        ("from Kafka: tasks read Kafka, bare apply", "tasks_read_kafka", steady("tasks_read_kafka")),
        ("from Parquet: source alone, no writes", "source_memory", steady("source_memory")),
        ("from Parquet, by range: source alone", "source_memory_ranged", steady("source_memory_ranged")),
        ("from Parquet, by range: PostgresSink", "sink_memory", steady("sink_memory")),
        ("from Parquet: JDBC append", "jdbc_memory", steady("jdbc_memory")),
        ("from Parquet: hand-written upsert", "hand_memory", steady("hand_memory")),
        ("from Parquet, by range: JDBC append", "jdbc_memory_ranged", steady("jdbc_memory_ranged")),
        ("from Parquet, by range: hand-written", "hand_memory_ranged", steady("hand_memory_ranged")),
        ("from kafka_rc: PostgresSink", "sink_rc", steady("sink_rc")),
    ]
    if "sink_rf3" in runs:
        lines += [
            ("from Kafka RF 3: source alone, no writes", "source_rf3", steady("source_rf3")),
            ("from Kafka RF 3: PostgresSink", "sink_rf3", steady("sink_rf3")),
        ]
    if "sink_avro" in runs:
        lines += [
            ("Avro: from_avro(substring) to Arrow", "source_avro_arrow", steady("source_avro_arrow")),
            ("Avro: PostgresSink, parse_avro", "sink_avro", steady("sink_avro")),
            ("Avro: from_avro + JDBC append", "jdbc_avro", steady("jdbc_avro")),
            ("Avro: from_avro + hand-written upsert", "hand_avro", steady("hand_avro")),
        ]
    print(f"{'':<42}  {'rows/s':>10}  {'CPU us/row':>10}")
    for label, name, value in lines:
        cpu = base["cpu_us_per_row"] if name == "psycopg" else runs[name]["cpu_us_per_row"]
        print(f"{label:<42}: {value:>10,.0f}  {cpu:>10.1f}")
    ratios = [
        ("sink / psycopg", "ratio_sink_vs_psycopg", ""),
        ("source alone / psycopg", "ratio_source_alone_vs_psycopg", "bounds any writer fed by it"),
        ("sink / jdbc", "ratio_sink_vs_jdbc", "target >= 1.2"),
        ("sink / hand-written", "ratio_sink_vs_hand", "target >= 1.5"),
        ("in the tasks / on the driver", "ratio_sink_vs_sink_driver", ""),
        ("tracing / not", "ratio_sink_traced_vs_sink", "two Spark runs differ by more than tracing costs"),
        ("from Parquet, sink / psycopg", "ratio_sink_memory_vs_psycopg", "target >= 0.8"),
        ("from Parquet, sink / jdbc", "ratio_sink_memory_vs_jdbc_memory", "target >= 1.5"),
        ("from Parquet, sink / hand-written", "ratio_sink_memory_vs_hand_memory", "target >= 1.0"),
        ("by range, sink / jdbc", "ratio_sink_memory_vs_jdbc_memory_ranged", "the same feed"),
        ("by range, sink / hand-written", "ratio_sink_memory_vs_hand_memory_ranged", "the same feed"),
        ("sink from kafka_rc / from Spark's", "ratio_sink_rc_vs_sink", ""),
        (
            "tasks read Kafka, bare / jdbc",
            "ratio_tasks_read_kafka_vs_jdbc",
            "the sink's design without its checks",
        ),
        ("tasks read Kafka / hand-written", "ratio_tasks_read_kafka_vs_hand", "the same"),
        ("sink / tasks read Kafka", "ratio_sink_vs_tasks_read_kafka", ""),
    ]
    if "sink_rf3" in runs:
        ratios += [
            ("source, RF 3 / one broker", "ratio_source_rf3_vs_1", "the cost of replication"),
            ("sink, RF 3 / one broker", "ratio_sink_rf3_vs_1", "the cost of replication"),
        ]
    if "sink_avro" in runs:
        ratios += [
            ("Avro, sink / jdbc", "ratio_sink_avro_vs_jdbc", "target >= 1.2"),
            ("Avro, sink / hand-written", "ratio_sink_avro_vs_hand", ""),
            ("sink, Avro / JSON", "ratio_sink_avro_vs_sink", ""),
        ]
    for label, key, note in ratios:
        rounds = f" rounds {', '.join(map(str, spread[key]))}" if key in spread else ""
        print(f"{'ratio ' + label:<42}: {result[key]:>10} {f'({note})' if note else ''}{rounds}")
    twice = {name: run["source_reads"] for name, run in runs.items() if run["source_reads"] != 1}
    result["source_reads"] = twice
    if twice:
        print(
            f"read their source more than once (a range repartition samples it first): {twice};"
            " each row counted once"
        )
    cores = os.cpu_count() or 1
    print(f"the machine's bound for each run: {cores} cores / its CPU per row; busy: the cores' share used")
    result["machine_cores"] = cores
    for label, name, _ in lines:
        whole = base if name == "psycopg" else runs[name]
        cpu = whole["cpu_us_per_row"]
        bound, busy = cores * 1e6 / cpu, whole["steady_per_s"] * cpu / (cores * 1e6)
        print(f"  {label:<40}: bound {bound:>10,.0f} rows/s, busy {busy:>4.0%}")
    who = [c for c, _ in COMPONENTS] + [DRIVER, "other"]
    print("CPU us/row by process, steady batches:", " | ".join(who))
    result["cpu_us_per_row_by"] = {"psycopg": base["cpu_us_per_row_by"]}
    for label, name, _ in lines:
        by = base["cpu_us_per_row_by"] if name == "psycopg" else runs[name]["cpu_us_per_row_by"]
        result["cpu_us_per_row_by"][name] = by  # type: ignore[index]
        print(f"  {label:<40}: " + " | ".join(f"{by.get(c, 0.0):>5.1f}" for c in who))
    print("the Spark JVM's garbage collection, pause us per row (steady batches):")
    result["gc_us_per_row"] = {
        name: round(runs[name]["gc_us_per_row"], 1) for _, name, _ in lines if name in runs
    }
    print("  " + ", ".join(f"{name} {v:.1f}" for name, v in result["gc_us_per_row"].items()))  # type: ignore[attr-defined]
    phases = ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets")
    print("a steady batch's phases, median ms (Spark's durationMs):", " | ".join(phases))
    result["phases_ms"] = {name: runs[name]["phases_ms"] for _, name, _ in lines if name in runs}
    for label, name, _ in lines:
        if name in runs:
            print(f"  {label:<40}: " + " | ".join(f"{runs[name]['phases_ms'].get(p, 0):>6}" for p in phases))
    print("per batch, slowest task's copy / apply seconds (on the driver: stage job / apply):")
    for name in (n for n in SINKS if n in runs):
        detail = " ".join(f"{b['stage_s']:.2f}/{b['apply_s']:.2f}" for b in runs[name]["batches_detail"])
        print(f"  {name:<12} {detail}")
    # Where the time goes: each writer's task seconds per event and stage (summed over its tasks,
    # so up to the cores' count times the wall time), beside its wall time per event; and the
    # source alone, without and with Spark's conversion to Arrow, in wall time per event.
    breakdown: dict[str, object] = {"unit": "task microseconds per event; wall_us: wall per event"}
    print("where the time goes, task us per event by stage (wall us per event):")
    for name in (n for n in runs if "stages_us" in runs[n]):
        stages = {k: round(v, 2) for k, v in runs[name]["stages_us"].items()}
        breakdown[name] = {**stages, "wall_us": round(1e6 / steady(name), 2)}
        cells = " | ".join(f"{k} {v:.1f}" for k, v in stages.items())
        print(f"  {name:<12} {cells}  ({1e6 / steady(name):.1f})")
    fetch, to_arrow = 1e6 / steady("source"), 1e6 / steady("source_arrow")
    breakdown |= {"source_wall_us": round(fetch, 2), "source_to_arrow_wall_us": round(to_arrow, 2)}
    print(
        f"  source alone (fetch, decode) {fetch:.1f}; and to Arrow in Python {to_arrow:.1f}"
        f" (Arrow: {to_arrow - fetch:+.1f})"
    )
    result["breakdown"] = breakdown
    # Tracing's cost: the applying statement alone, with and without it (trace_cost), against the
    # sink's whole task time per event; two Spark runs' rates differ by more than that here.
    share = tracing["trace_us"] / sum(runs["sink"]["stages_us"].values())
    result |= {f"{k}_per_event": round(v, 2) for k, v in tracing.items()}
    result["trace_share_of_sink_task_us"] = round(share, 3)
    print(
        f"tracing: the applying statement alone {tracing['apply_us']:.1f} us per event, traced"
        f" {tracing['apply_traced_us']:.1f}: {tracing['trace_us']:+.1f} us, {share:.1%} of the sink's task"
        " time per event (target <= 5%)"
    )
    # What the machine leaves the sink, from this run. Where its tasks take their rows from Spark as
    # Arrow: the ceiling, in wall time: no sink outruns its feed handed to Python as Arrow and dropped,
    # whatever it writes; the bound, in CPU: it costs at least that feed plus the bare COPY + upsert
    # of the same rows (psycopg alone), so all cores busy on nothing else it reaches at most their
    # count over that floor. Where its tasks read Kafka themselves (sinks/postgres/direct.py), the
    # same for the bare form of that design, tasks_read_kafka, which reads, parses, COPYs and upserts
    # as the sink's tasks do, without its checks, dead letters and counts. Each is a ratio to a
    # peer's measured rate; the lower one holds. And the floor at the peer's own share of the cores
    # (its CPU per row over the floor's): a Spark writer here keeps about three quarters of them
    # busy, and only a busier one could pass it.
    reads_kafka = "its tasks read" in str(runs["sink"].get("route", ""))
    kafka_feed = "tasks_read_kafka" if reads_kafka else "source_arrow"
    for feed, arrow, peers in (
        ("Kafka", kafka_feed, ("jdbc", "hand")),
        ("Parquet", "source_memory_arrow", ("jdbc_memory", "hand_memory")),
    ):
        suffix = "" if feed == "Kafka" else "_memory"
        upsert = 0.0 if arrow == "tasks_read_kafka" else base["cpu_us_per_row"]  # in its own CPU already

        def floor_of(a: dict[str, Any], upsert: float = upsert) -> float:
            return a["cpu_us_per_row"] + upsert

        floor = floor_of(runs[arrow])
        bound = cores * 1e6 / floor
        result[f"floor{suffix}_cpu_us_per_row"] = round(floor, 1)
        what = (
            "the bare design, tasks_read_kafka"
            if arrow == "tasks_read_kafka"
            else "fed to Python as Arrow, dropped"
        )
        print(
            f"from {feed}, at best: the ceiling {steady(arrow):,.0f} events/s ({what}); the bound"
            f" {bound:,.0f} ({cores} cores over {floor:.1f} CPU us per row: {arrow}"
            f" {runs[arrow]['cpu_us_per_row']:.1f} + upsert {upsert:.1f}); so"
        )
        for peer in peers:
            # Within each round, as the ratios are: the feed's rate and CPU beside that round's peer.
            ceiling = across(
                (arrow, peer),
                lambda a, p: a["steady_per_s"] / p["steady_per_s"],
                f"ceiling_ratio_sink{suffix}_vs_{peer}",
            )
            best = across(
                (arrow, peer),
                lambda a, p: cores * 1e6 / floor_of(a) / p["steady_per_s"],
                f"bound_ratio_sink{suffix}_vs_{peer}",
            )
            alike = across(
                (arrow, peer),
                lambda a, p: p["cpu_us_per_row"] / floor_of(a),
                f"alike_ratio_sink{suffix}_vs_{peer}",
            )
            result[f"ceiling_ratio_sink{suffix}_vs_{peer}"] = ceiling
            result[f"bound_ratio_sink{suffix}_vs_{peer}"] = best
            result[f"alike_ratio_sink{suffix}_vs_{peer}"] = alike
            print(
                f"  sink / {peer:<11}: ceiling {ceiling:.2f}, bound {best:.2f};"
                f" at {peer}'s share of the cores {alike:.2f}"
            )
    if "sink_avro" in runs:
        # Avro: the sink's tasks decode each value in Python (fastavro), which the peers' from_avro
        # does in the JVM. Its floor: the peer's frame handed to Python as Arrow (a feed no cheaper
        # than the sink's raw one), the decode alone (avro_decode, one process), the bare COPY +
        # upsert; the bound is the cores over it, as a ratio to each peer's rate, round by round.
        decoded = decode["cpu_us"]

        def avro_floor(a: dict[str, Any]) -> float:
            return a["cpu_us_per_row"] + decoded + base["cpu_us_per_row"]

        for peer in ("jdbc_avro", "hand_avro"):
            key = f"bound_ratio_sink_avro_vs_{peer.removesuffix('_avro')}"
            result[key] = across(
                ("source_avro_arrow", peer),
                lambda a, p: cores * 1e6 / avro_floor(a) / p["steady_per_s"],
                key,
            )
        floor = avro_floor(runs["source_avro_arrow"])
        result["floor_avro_cpu_us_per_row"] = round(floor, 1)
        arrow_cpu, upsert_cpu = runs["source_avro_arrow"]["cpu_us_per_row"], base["cpu_us_per_row"]
        print(
            f"Avro, at best: the bound {cores * 1e6 / floor:,.0f} events/s ({cores} cores over"
            f" {floor:.1f} CPU us per row: the peer's feed to Arrow {arrow_cpu:.1f} + fastavro's decode"
            f" {decoded:.1f} + upsert {upsert_cpu:.1f}); at best sink / jdbc"
            f" {result['bound_ratio_sink_avro_vs_jdbc']}, / hand {result['bound_ratio_sink_avro_vs_hand']}"
        )
    result["rounds"] = args.rounds
    result["ratio_rounds"] = spread
    every = [
        (f"{name} round {k}", r)
        for name, run in runs.items()
        for k, r in enumerate(run.get("rounds", [run]), 1)
    ]
    wrong = {name: r["written"] for name, r in every if "written" in r and r["written"] != args.events}
    if wrong:
        print(f"ERROR: rows written, expected {args.events}: {wrong}", file=sys.stderr)
    flags.finish("sink", result, args)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
