"""What the sink is held against outside Spark: psycopg's COPY + upsert alone (the limit), the sink's
applying statement with and without tracing, and fastavro's decode alone."""

from __future__ import annotations

import io
import time
from typing import Any, cast

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from cpu import measured  # bench/cpu.py
from sink_plan import AVRO_SCHEMA, TABLE  # bench/sink_plan.py
from sink_run import figures, settle  # bench/sink_run.py

from outbox.core.config import DatabaseUrl


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
