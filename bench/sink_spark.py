"""Every Spark run of the sink bench in one SparkSession: what each run reads and what writes it, the
warm-up, and the compared runs round by round."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from sink_peers import HAND_STAGES, RANGE_STAGES, hand_written_upsert, jdbc_append, tasks_read_kafka
from sink_plan import AVRO_SCHEMA, RANGES, ROUNDED, SCHEMA, TABLE, WARMED, WRITERS, round_order
from sink_run import Recorded, count, run, settle, stream  # bench/sink_run.py

from outbox.core.config import DatabaseUrl
from sinks.postgres.clock import STAGES


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
    warmup: bool,
    ranges: Path,
    sizes: list[int],
    avro: tuple[str, str] | None,
) -> dict[str, dict[str, Any]]:
    """Every Spark run, in one SparkSession: from Kafka, then from Parquet, each of `total` rows.

    replicated: the servers of the RF 3 cluster holding the same topic, or None.
    warmup: whether each writer from Kafka first runs once unmeasured (WARMED).
    ranges: the files of the topic's offset ranges (write_ranges), `sizes` the events of each.
    avro: the topic holding the same events as Avro, and the registry's URL; or None."""
    from outbox_dev.jvm import maven
    from outbox_dev.local_spark import kafka_connector_jars, local_session, stop_session
    from sinks.kafka_source import register

    jdbc_driver = maven.jars("postgres-jdbc", what="the PostgreSQL JDBC driver (the JDBC peer)")
    spark_avro = maven.jars("spark-avro", what="Spark's Avro functions (the Avro peers)") if avro else []
    jars = [*kafka_connector_jars(), *jdbc_driver, *spark_avro]
    spark = local_session(work, app_name="bench-sink", jars=jars)
    try:
        register(spark)
        sinks: dict[str, Recorded] = {}
        clocks: dict[str, dict[str, Any]] = {}
        frames = feeds(spark, bootstrap, topic, per_batch, parquet, partitions, ranges, avro)
        plan = plan_of(frames, writers(spark, url, bootstrap, partitions, sinks, clocks), avro, replicated)
        offsets = frames["offsets"]
        warmed = [w for w in WARMED if w in plan] if warmup else []
        make_tables(url, warmed, rounds, partitions)

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

        runs = measure_rounds(measure, plan, warmed, rounds, avro)
        round_medians(runs)
        sink_details(runs, sinks)
        clocked_stages(runs, clocks)
    finally:
        stop_session(spark)
    return runs


def feeds(
    spark: Any,
    bootstrap: str,
    topic: str,
    per_batch: int,
    parquet: Path,
    partitions: int,
    ranges: Path,
    avro: tuple[str, str] | None,
) -> dict[str, Callable]:
    """What the runs read, each a function making its frame: Spark's Kafka source (or kafka_rc), the
    Avro topic as the sink reads it and as its peers do, the Parquet files as they are and by range,
    and the files of offset ranges."""
    from sinks.postgres import parse_avro, parse_json

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
        return spark.readStream.schema(typed).option("maxFilesPerTrigger", partitions).parquet(str(parquet))

    def ranged():  # type: ignore[no-untyped-def]
        return memory().repartitionByRange(partitions, "topic", "partition")

    def offsets():  # type: ignore[no-untyped-def]
        return spark.readStream.schema(RANGES).option("maxFilesPerTrigger", 1).json(str(ranges))

    return {
        "kafka": kafka,
        "avro_sink": avro_sink_feed,
        "avro_peer": avro_peer_feed,
        "memory": memory,
        "ranged": ranged,
        "offsets": offsets,
    }


def writers(
    spark: Any,
    url: DatabaseUrl,
    bootstrap: str,
    partitions: int,
    sinks: dict[str, Recorded],
    clocks: dict[str, dict[str, Any]],
) -> dict[str, Callable]:
    """What makes a run's batch function for a table (and its frame): the sink (each kept in `sinks`),
    its peers (the clocked ones' accumulators kept in `clocks`), and the runs that write nothing."""
    from sinks.postgres import PostgresSink

    def sink(table: str, frame, apply_in: str = "auto", trace: bool = False):  # type: ignore[no-untyped-def]
        made = PostgresSink(table, url=url.raw, name=table, apply_in=apply_in, trace=trace)  # type: ignore[arg-type]
        sinks[table] = Recorded(made.writer(frame))
        return sinks[table]

    def noop(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        batch.write.format("noop").mode("append").save()

    def jdbc(table: str, _frame):  # type: ignore[no-untyped-def]
        return jdbc_append(url, table)

    def hand(table: str, _frame):  # type: ignore[no-untyped-def]
        clock = clocks[table] = {stage: spark.sparkContext.accumulator(0.0) for stage in HAND_STAGES}
        return hand_written_upsert(url.libpq, table, clock)

    def read_kafka(table: str, _frame):  # type: ignore[no-untyped-def]
        clock = clocks[table] = {stage: spark.sparkContext.accumulator(0.0) for stage in RANGE_STAGES}
        return tasks_read_kafka(url.libpq, bootstrap, table, partitions, clock)

    def to_arrow(batch, _: int) -> None:  # type: ignore[no-untyped-def]
        """The rows handed to Python as Arrow, as the sink's tasks get them, and dropped."""
        batch.mapInArrow(lambda batches: (b.slice(0, 0) for b in batches), batch.schema).write.format(
            "noop"
        ).mode("append").save()

    return {
        "sink": sink,
        "noop": noop,
        "jdbc": jdbc,
        "hand": hand,
        "read_kafka": read_kafka,
        "to_arrow": to_arrow,
    }


def plan_of(
    frames: dict[str, Callable],
    makers: dict[str, Callable],
    avro: tuple[str, str] | None,
    replicated: str | None,
) -> dict[str, tuple[Callable, Callable]]:
    """Every measured run, in the order they run: its feed, and what makes its writer for a table."""
    kafka, memory, ranged, offsets = frames["kafka"], frames["memory"], frames["ranged"], frames["offsets"]
    avro_sink_feed, avro_peer_feed = frames["avro_sink"], frames["avro_peer"]
    sink, noop, jdbc, hand = makers["sink"], makers["noop"], makers["jdbc"], makers["hand"]
    read_kafka, to_arrow = makers["read_kafka"], makers["to_arrow"]

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
    return plan


def make_tables(url: DatabaseUrl, warmed: list[str], rounds: int, partitions: int) -> None:
    """Each writer's table for every round and for its warm-up, and the ledger tasks_read_kafka moves."""
    again = [f"bench_{n}_{k}" for n in ROUNDED if n in WRITERS for k in range(2, rounds + 1)]
    tables = [*(f"bench_{n}" for n in WRITERS), *again]
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        for table in (*tables, *(f"bench_warm_{w}" for w in warmed)):
            conn.execute(TABLE.format(table))
        conn.execute("CREATE TABLE bench_ledger (tbl text, p int, next_offset bigint, PRIMARY KEY (tbl, p))")
        conn.execute(
            "INSERT INTO bench_ledger SELECT t, p, 0"
            " FROM unnest(%s::text[]) AS t, generate_series(0, %s) AS p",
            [[*tables, "bench_warm_tasks_read_kafka"], partitions - 1],
        )


def measure_rounds(
    measure: Callable[[str, str], dict],
    plan: dict[str, tuple[Callable, Callable]],
    warmed: list[str],
    rounds: int,
    avro: tuple[str, str] | None,
) -> dict[str, dict[str, Any]]:
    """The warm-ups, the runs measured once, then the compared runs round by round: each run's result,
    a compared run's with its rounds'."""
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
    return runs


def round_medians(runs: dict[str, dict[str, Any]]) -> None:
    """A compared run's figures: its rounds' medians."""
    for name in (n for n in ROUNDED if n in runs):  # a compared run's figures: its rounds' median
        each = runs[name]["rounds"]
        runs[name]["steady_per_s"] = median([r["steady_per_s"] for r in each])
        runs[name]["cpu_us_per_row"] = median([r["cpu_us_per_row"] for r in each])
        by = {c for r in each for c in r["cpu_us_per_row_by"]}
        runs[name]["cpu_us_per_row_by"] = {
            c: round(median([r["cpu_us_per_row_by"].get(c, 0.0) for r in each]), 1) for c in sorted(by)
        }


def sink_details(runs: dict[str, dict[str, Any]], sinks: dict[str, Recorded]) -> None:
    """Each sink run's route, its batches, and its tasks' seconds per stage and row (steady batches)."""
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


def clocked_stages(runs: dict[str, dict[str, Any]], clocks: dict[str, dict[str, Any]]) -> None:
    """The clocked peers' task seconds per stage and row, from their accumulators."""
    for table, clock in clocks.items():
        name = table.removeprefix("bench_")
        if name in runs:  # the whole run, first batch included: accumulators do not say per batch
            runs[name]["stages_us"] = {s: a.value / runs[name]["rows_all"] * 1e6 for s, a in clock.items()}
