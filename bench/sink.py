"""Throughput of the exactly-once PostgreSQL sink, beside its limit and Spark's JDBC writer, in one run.

Produces N JSON events of ~SIZE bytes to Kafka, then writes the same events these ways:
  psycopg: no Spark, no Kafka: the rows already in memory, per batch Arrow-encoded
           CSV COPY into a temp table + one INSERT .. ON CONFLICT (the limit here);
  sink:    kafka_rc -> parse_json -> PostgresSink (upsert on event_id, ledger);
  jdbc:    kafka_rc -> parse_json -> foreachBatch DataFrame.write.jdbc(mode="append"),
           PostgreSQL JDBC driver from POSTGRES_JDBC_JAR or the Debian package
           libpostgresql-jdbc-java (/usr/share/java/postgresql.jar); skipped if absent.
Beside them, what the Kafka side allows and what the writers cost without it:
  source:  kafka_rc -> parse_json -> noop: the same input with no writing at all;
           no sink fed by it can be faster, so source / psycopg bounds sink / psycopg;
  memory:  the sink and the JDBC writer fed the same typed rows (with their Kafka
           positions) from Parquet files, one per micro-batch: the writers alone.
All runs use the same micro-batch size. Steady state excludes the first batch.

    python bench/sink.py [--events 1000000] [--size 200] [--batches 5] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from kafka_load import EMBEDDED_BROKER_FETCH, produce  # bench/kafka_load.py

from outbox import migrate
from outbox.config import DatabaseUrl
from outbox.dev.stack import running

JDBC_JARS = ("/usr/share/java/postgresql.jar",)
SCHEMA = "event_id string, n long, amount decimal(12,2), note string"
TABLE = "CREATE TABLE {} (event_id uuid PRIMARY KEY, n bigint, amount numeric(12,2), note text)"
WRITERS = ("sink", "sink_memory", "jdbc", "jdbc_memory")  # the Spark runs that write, each to bench_<name>


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


def psycopg_alone(url: DatabaseUrl, rows: pa.Table, per_batch: int) -> dict[str, float]:
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


def figures(rows: list[int], seconds: list[float]) -> dict[str, float]:
    return {
        "rows": sum(rows),
        "batches": len(rows),
        "whole_run_per_s": sum(rows) / sum(seconds),
        "steady_per_s": sum(rows[1:]) / sum(seconds[1:]) if len(rows) > 1 else float("nan"),
    }


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


def spark_runs(
    url: DatabaseUrl,
    bootstrap: str,
    topic: str,
    work: Path,
    per_batch: int,
    jar: str | None,
    extra: dict,
    parquet: Path,
    partitions: int,
) -> dict[str, dict[str, float] | None]:
    """Every Spark run, in one SparkSession: from Kafka, then from Parquet."""
    from sinks.kafka_source import register
    from sinks.local_spark import local_session, stop_session
    from sinks.postgres import PostgresSink, parse_json

    spark = local_session(work, app_name="bench-sink", conf={"spark.jars": jar} if jar else None)
    try:
        register(spark)

        def kafka():  # type: ignore[no-untyped-def]
            raw = (
                spark.readStream.format("kafka_rc")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("maxOffsetsPerTrigger", str(per_batch))
                .options(**{f"kafka.{k}": v for k, v in extra.items()})
                .load()
            )
            return parse_json(raw, SCHEMA, key_column="event_id")

        def memory():  # type: ignore[no-untyped-def]
            typed = f"{SCHEMA}, topic string, partition int, offset long"
            return (
                spark.readStream.schema(typed).option("maxFilesPerTrigger", partitions).parquet(str(parquet))
            )

        def sink(table: str, frame):  # type: ignore[no-untyped-def]
            return PostgresSink(table, url=url.raw, name=table).writer(frame)

        def noop(batch, _: int) -> None:  # type: ignore[no-untyped-def]
            batch.write.format("noop").mode("append").save()

        with psycopg.connect(url.libpq, autocommit=True) as conn:
            for name in WRITERS:
                conn.execute(TABLE.format(f"bench_{name}"))
        runs: dict[str, dict[str, float] | None] = {}
        runs["source"] = run(kafka(), noop, work / "chk-source")
        events = kafka()
        runs["sink"] = run(events, sink("bench_sink", events), work / "chk-sink")
        events = memory()
        runs["sink_memory"] = run(events, sink("bench_sink_memory", events), work / "chk-sink-memory")
        runs["jdbc"] = runs["jdbc_memory"] = None
        if jar:
            # stringtype=unspecified lets PostgreSQL turn the event id string into uuid.
            jdbc_url = f"jdbc:postgresql://{url.libpq.split('@', 1)[1]}?stringtype=unspecified"
            user = url.libpq.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]

            def append(table: str) -> Callable:
                def each(batch, _: int) -> None:  # type: ignore[no-untyped-def]
                    batch.select("event_id", "n", "amount", "note").write.jdbc(
                        jdbc_url,
                        table,
                        mode="append",
                        properties={"user": user, "driver": "org.postgresql.Driver"},
                    )

                return each

            runs["jdbc"] = run(kafka(), append("bench_jdbc"), work / "chk-jdbc")
            runs["jdbc_memory"] = run(memory(), append("bench_jdbc_memory"), work / "chk-jdbc-memory")
        for name in WRITERS:
            if runs[name] is not None:
                runs[name]["written"] = count(url, f"bench_{name}")  # type: ignore[index]
    finally:
        stop_session(spark)
    return runs


def run(frame, each_batch: Callable, checkpoint: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    query = (
        frame.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    total = time.perf_counter() - start
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    rows = [b["numInputRows"] for b in batches]
    result = figures(rows, [b["durationMs"]["triggerExecution"] / 1000 for b in batches])
    result["whole_run_per_s"] = sum(rows) / total
    return result


def count(url: DatabaseUrl, table: str) -> int:
    with psycopg.connect(url.libpq) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]


def jdbc_jar() -> tuple[str | None, str]:
    given = os.environ.get("POSTGRES_JDBC_JAR")
    for jar in (given, *JDBC_JARS) if given else JDBC_JARS:
        if Path(jar).is_file():
            return jar, ""
    return None, (
        "no PostgreSQL JDBC driver: `apt-get install libpostgresql-jdbc-java` or set POSTGRES_JDBC_JAR"
        " to the driver's jar (no Maven repository is reachable for --packages)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200, help="JSON bytes per event")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batches", type=int, default=5, help="micro-batches the run is split into")
    parser.add_argument("--json", action="store_true", help="end with one JSON object")
    args = parser.parse_args()
    jar, no_jdbc = jdbc_jar()
    per_batch = -(-args.events // args.batches)

    with tempfile.TemporaryDirectory(prefix="bench-sink-", dir=os.environ.get("TMPDIR")) as tmp:
        work = Path(tmp)
        with running(work / "services") as started:
            env = {
                **started,
                **{k: v for k in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS") if (v := os.environ.get(k))},
            }
            url, bootstrap = DatabaseUrl.parse(env["DATABASE_URL"]), env["KAFKA_BOOTSTRAP_SERVERS"]
            extra = {} if os.environ.get("KAFKA_BOOTSTRAP_SERVERS") else EMBEDDED_BROKER_FETCH
            migrate.upgrade(url, "public")
            rows = events(args.events, args.size)
            topic = f"bench.sink.{uuid.uuid4().hex[:8]}"
            records = ((r["event_id"].encode(), json.dumps(r).encode()) for r in rows.to_pylist())
            produce(bootstrap, topic, records, args.partitions)
            base = psycopg_alone(url, rows, per_batch)
            write_parquet(rows, topic, args.partitions, per_batch, work / "parquet")
            runs = spark_runs(
                url,
                bootstrap,
                topic,
                work / "spark",
                per_batch,
                jar,
                extra,
                work / "parquet",
                args.partitions,
            )

    def steady(name: str) -> float | None:
        run = runs[name]
        return None if run is None else run["steady_per_s"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a / b, 3)

    limit = base["steady_per_s"]
    result: dict[str, object] = {
        "events": args.events,
        "event_bytes": args.size,
        "batches": args.batches,
        "psycopg_steady_per_s": round(limit),
        "psycopg_whole_run_per_s": round(base["whole_run_per_s"]),
        **{f"{name}_steady_per_s": _round(steady(name)) for name in runs},
        "sink_whole_run_per_s": round(runs["sink"]["whole_run_per_s"]),  # type: ignore[index]
        "ratio_sink_vs_psycopg": ratio(steady("sink"), limit),
        "target_vs_psycopg": 0.6,
        "ratio_source_alone_vs_psycopg": ratio(steady("source"), limit),
        "ratio_sink_memory_vs_psycopg": ratio(steady("sink_memory"), limit),
        "ratio_sink_vs_jdbc": ratio(steady("sink"), steady("jdbc")),
        "ratio_sink_memory_vs_jdbc_memory": ratio(steady("sink_memory"), steady("jdbc_memory")),
        "target_vs_jdbc": 3.0,
        "ratio_psycopg_vs_jdbc_memory": ratio(limit, steady("jdbc_memory")),
        "jdbc_skipped": no_jdbc or None,
    }
    lines = [
        ("psycopg COPY + upsert (the limit)", limit),
        ("from Kafka: PostgresSink", steady("sink")),
        ("from Kafka: JDBC append", steady("jdbc")),
        ("from Kafka: source alone, no writes", steady("source")),
        ("from Parquet: PostgresSink", steady("sink_memory")),
        ("from Parquet: JDBC append", steady("jdbc_memory")),
    ]
    for label, value in lines:
        shown = f"{value:>10,.0f} events/s" if value is not None else f"skipped: {no_jdbc}"
        print(f"{label:<38}: {shown}")
    ratios = [
        ("sink / psycopg", "ratio_sink_vs_psycopg", "target >= 0.6"),
        ("source alone / psycopg", "ratio_source_alone_vs_psycopg", "bounds the one above"),
        ("sink from Parquet / psycopg", "ratio_sink_memory_vs_psycopg", "the sink's own path"),
        ("sink / jdbc", "ratio_sink_vs_jdbc", "target >= 3"),
        ("from Parquet, sink / jdbc", "ratio_sink_memory_vs_jdbc_memory", ""),
        ("psycopg / jdbc from Parquet", "ratio_psycopg_vs_jdbc_memory", "bounds the two above"),
    ]
    for label, key, note in ratios:
        if result[key] is not None:
            print(f"{'ratio ' + label:<38}: {result[key]:>10} {f'({note})' if note else ''}")
    wrong = {
        name: run["written"]
        for name, run in runs.items()
        if run is not None and "written" in run and run["written"] != args.events
    }
    if wrong:
        print(f"ERROR: rows written, expected {args.events}: {wrong}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    return 1 if wrong else 0


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


if __name__ == "__main__":
    sys.exit(main())
