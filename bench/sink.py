"""Throughput of the exactly-once PostgreSQL sink, beside its limit and Spark's JDBC writer, in one run.

Produces N JSON events of ~SIZE bytes to Kafka, then writes the same events three ways:
  psycopg: no Spark, no Kafka: the rows already in memory, per batch Arrow-encoded
           CSV COPY into a temp table + one INSERT .. ON CONFLICT (the limit here);
  sink:    kafka_rc -> parse_json -> PostgresSink (upsert on event_id, ledger);
  jdbc:    kafka_rc -> parse_json -> foreachBatch DataFrame.write.jdbc(mode="append"),
           PostgreSQL JDBC driver from POSTGRES_JDBC_JAR or the Debian package
           libpostgresql-jdbc-java (/usr/share/java/postgresql.jar); skipped if absent.
All three use the same micro-batch size. Steady state excludes the first batch.

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

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from kafka_load import EMBEDDED_BROKER_FETCH, produce  # bench/kafka_load.py

from outbox import migrate
from outbox.config import DatabaseUrl
from outbox.dev.stack import running

JDBC_JARS = ("/usr/share/java/postgresql.jar",)
SCHEMA = "event_id string, n long, amount decimal(12,2), note string"
TABLE = "CREATE TABLE {} (event_id uuid PRIMARY KEY, n bigint, amount numeric(12,2), note text)"


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
    return figures(
        [min(per_batch, rows.num_rows - s) for s in range(0, rows.num_rows, per_batch)], seconds, count
    )


def figures(rows: list[int], seconds: list[float], written: int) -> dict[str, float]:
    return {
        "rows": sum(rows),
        "written": written,
        "batches": len(rows),
        "whole_run_per_s": sum(rows) / sum(seconds),
        "steady_per_s": sum(rows[1:]) / sum(seconds[1:]) if len(rows) > 1 else float("nan"),
    }


def spark_runs(
    url: DatabaseUrl, bootstrap: str, topic: str, work: Path, per_batch: int, jar: str | None, extra: dict
) -> tuple[dict[str, float], dict[str, float] | None]:
    from sinks.kafka_source import register
    from sinks.local_spark import local_session, stop_session
    from sinks.postgres import PostgresSink, parse_json

    spark = local_session(work, app_name="bench-sink", conf={"spark.jars": jar} if jar else None)
    try:
        register(spark)

        def frame():  # type: ignore[no-untyped-def]
            raw = (
                spark.readStream.format("kafka_rc")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .option("maxOffsetsPerTrigger", str(per_batch))
                .options(**{f"kafka.{k}": v for k, v in extra.items()})
                .load()
            )
            return parse_json(raw, SCHEMA, key_column="event_id")

        with psycopg.connect(url.libpq, autocommit=True) as conn:
            conn.execute(TABLE.format("bench_sink"))
            conn.execute(TABLE.format("bench_jdbc"))
        events = frame()
        sink = run(events, PostgresSink("bench_sink", url=url.raw).writer(events), work / "chk-sink")
        sink["written"] = count(url, "bench_sink")
        jdbc = None
        if jar:
            # stringtype=unspecified lets PostgreSQL turn the event id string into uuid.
            jdbc_url = f"jdbc:postgresql://{url.libpq.split('@', 1)[1]}?stringtype=unspecified"
            user = url.libpq.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]

            def append(batch, _: int) -> None:  # type: ignore[no-untyped-def]
                batch.select("event_id", "n", "amount", "note").write.jdbc(
                    jdbc_url,
                    "bench_jdbc",
                    mode="append",
                    properties={"user": user, "driver": "org.postgresql.Driver"},
                )

            jdbc = run(frame(), append, work / "chk-jdbc")
            jdbc["written"] = count(url, "bench_jdbc")
    finally:
        stop_session(spark)
    return sink, jdbc


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
    result = figures(rows, [b["durationMs"]["triggerExecution"] / 1000 for b in batches], 0)
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
            sink, jdbc = spark_runs(url, bootstrap, topic, work / "spark", per_batch, jar, extra)

    result: dict[str, object] = {
        "events": args.events,
        "event_bytes": args.size,
        "batches": args.batches,
        "psycopg_steady_per_s": round(base["steady_per_s"]),
        "psycopg_whole_run_per_s": round(base["whole_run_per_s"]),
        "sink_steady_per_s": round(sink["steady_per_s"]),
        "sink_whole_run_per_s": round(sink["whole_run_per_s"]),
        "sink_rows_written": sink["written"],
        "ratio_sink_vs_psycopg": round(sink["steady_per_s"] / base["steady_per_s"], 3),
        "target_vs_psycopg": 0.6,
        "jdbc_steady_per_s": round(jdbc["steady_per_s"]) if jdbc else None,
        "jdbc_whole_run_per_s": round(jdbc["whole_run_per_s"]) if jdbc else None,
        "ratio_sink_vs_jdbc": round(sink["steady_per_s"] / jdbc["steady_per_s"], 3) if jdbc else None,
        "target_vs_jdbc": 3.0,
        "jdbc_skipped": no_jdbc or None,
    }
    print(f"psycopg COPY + upsert, steady : {result['psycopg_steady_per_s']:>10,} events/s (the limit)")
    print(f"PostgresSink, steady          : {result['sink_steady_per_s']:>10,} events/s")
    print(f"PostgresSink, whole run       : {result['sink_whole_run_per_s']:>10,} events/s")
    if jdbc:
        print(f"Spark JDBC append, steady     : {result['jdbc_steady_per_s']:>10,} events/s")
    else:
        print(f"Spark JDBC append             : skipped: {no_jdbc}")
    print(f"ratio sink / psycopg          : {result['ratio_sink_vs_psycopg']:>10} (target >= 0.6)")
    if jdbc:
        print(f"ratio sink / jdbc             : {result['ratio_sink_vs_jdbc']:>10} (target >= 3)")
    ok = sink["written"] == args.events and (jdbc is None or jdbc["written"] == args.events)
    if not ok:
        print(
            f"ERROR: rows written: sink {sink['written']}, jdbc {jdbc and jdbc['written']}", file=sys.stderr
        )
    if args.json:
        print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
