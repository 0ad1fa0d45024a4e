"""How the cost per event grows with the work: a large table, a large outbox, many partitions.

Three curves, each point printed as events/s and us/event, then one JSON object
(`--json`) and a PNG of the curves (`--png`, default bench-scale.png):
  sink:     EVENTS events from Kafka (Spark's source, read_committed, parse_json)
            applied by PostgresSink into a table that already holds each of
            TABLE_ROWS rows (default 0, 1M, 10M): the upsert's index and the
            ledger on a large table. Each point reads a topic of its own (new
            event ids), and its tasks' per-stage times say which stage grew.
  relay:    the relay catching up on each of BACKLOGS rows waiting in the
            outbox (default 0, that is EVENTS alone, 1M, 10M), rows written in
            transactions of 100,000; and EVENTS new rows published while
            UNCLEANED (default 1M) rows it already published wait for cleanup.
            Its histograms say where a batch's time went (read, produce and commit).
  kafka_rc: EVENTS events read by kafka_rc (to a noop sink) from topics of
            each of PARTITIONS partitions (default 1, 12, 48), and by Spark's
            own Kafka source from the same topics, the peer. Each point's cost
            is split three ways: the consumers kafka_rc makes, one a range
            (one made, first record read, closed, is timed in the driver);
            Spark's own cost for as many Python tasks as a micro-batch has
            (small ranges share a task, minRecordsPerTask), reading nothing (a
            job of that many empty mapInArrow tasks, timed); and the rest, the
            reading.
--curves picks some of them (default relay,sink,kafka_rc).
The aim: at the largest point, the cost per event within 1.5x of the smallest;
where it is not, the line names the stage that grew most.

    python bench/scale.py [--events 200000] [--table-rows 0,1000000,10000000]
                          [--backlogs 0,1000000,10000000] [--uncleaned 1000000]
                          [--partitions 1,12,48] [--png bench-scale.png] [--json]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set, else starts embedded services.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import flags  # bench/flags.py
import psycopg
from kafka_load import produce  # bench/kafka_load.py
from psycopg import sql
from relay import create_topic, relay_run  # bench/relay.py
from services import services  # bench/services.py
from sink import SCHEMA, TABLE, Recorded, events, run, settle, stream  # bench/sink.py

from outbox.core.config import DatabaseUrl
from outbox.relay import RelaySettings
from sinks.kafka_source.options import MIN_RECORDS_PER_TASK
from sinks.kafka_source.ranges import Range, pack
from sinks.postgres.clock import STAGES

AIM = 1.5  # the largest point's cost per event over the smallest's
CHUNK = 100_000  # outbox rows per writing transaction, as many writers' commits would be


def main() -> int:
    parser = flags.parser(__doc__, events=200_000, size_help="bytes per event value")
    parser.add_argument("--table-rows", default="0,1000000,10000000", help="rows the sink's table holds")
    parser.add_argument("--backlogs", default="0,1000000,10000000", help="rows waiting in the outbox")
    parser.add_argument("--uncleaned", type=int, default=1_000_000, help="published rows not cleaned up")
    parser.add_argument("--partitions", default="1,12,48", help="partitions of the topics kafka_rc reads")
    parser.add_argument("--png", default="bench-scale.png", help="where to draw the curves ('' for none)")
    parser.add_argument("--curves", default="relay,sink,kafka_rc", help="which curves to measure")
    args = parser.parse_args()
    batch = RelaySettings.batch_size
    if "relay" in args.curves and min(args.events, args.uncleaned) < 2 * batch:
        # The relay's rate leaves out its first batch: with one batch there is nothing to time.
        parser.error(
            f"--events and --uncleaned must be at least twice the relay's batch ({batch}), for a steady state"
        )

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x]

    with (
        tempfile.TemporaryDirectory(prefix="bench-scale-", dir=os.environ.get("TMPDIR")) as tmp,
        services(Path(tmp) / "services") as (url, bootstrap),
    ):
        began = time.monotonic()
        result: dict[str, Any] = {"events": args.events, "event_bytes": args.size}
        curves = set(args.curves.split(","))
        result["relay"] = []
        if "relay" in curves:
            result["relay"] = relay_curve(url, bootstrap, args.events, ints(args.backlogs), args.uncleaned)
        result["sink"], result["kafka_rc"] = spark_curves(
            url,
            bootstrap,
            Path(tmp) / "spark",
            args.events,
            args.size,
            ints(args.table_rows) if "sink" in curves else [],
            ints(args.partitions) if "kafka_rc" in curves else [],
        )
        result["seconds"] = round(time.monotonic() - began)
    verdicts = report(result)
    if args.png:
        draw(result, Path(args.png))
        print(f"curves drawn in {args.png}")
    flags.finish("scale", {**result, "verdicts": verdicts}, args)
    return 0


# -- the relay ------------------------------------------------------------------------------------


def fill_outbox(url: DatabaseUrl, topic: str, count: int) -> None:
    """`count` rows of ~160 B for `topic`, over 1,000 keys, in transactions of CHUNK rows."""
    with psycopg.connect(url.libpq) as conn:
        for start in range(0, count, CHUNK):
            conn.execute(
                "INSERT INTO outbox_events (event_id, topic, key, value, header_keys, header_values)"
                " SELECT gen_random_uuid(), %s, convert_to('key-' || (g %% 1000), 'UTF8'),"
                " convert_to(repeat('x', 160), 'UTF8'), '{}', '{}' FROM generate_series(1, %s) AS g",
                [topic, min(CHUNK, count - start)],
            )
            conn.commit()


def publish(url: DatabaseUrl, bootstrap: str, name: str, count: int) -> dict[str, Any]:
    """Run relay `name` (cleanup off) until it has published `count` rows: its steady rate and
    where its time went."""
    run = relay_run(RelaySettings(url=url, bootstrap=bootstrap, name=name, cleanup=False), count)
    return {
        "per_s": run["steady_per_s"],
        "us_per_event": 1e6 / run["steady_per_s"],
        "stages_us": run["stages_us"],
    }


def relay_curve(
    url: DatabaseUrl, bootstrap: str, events: int, backlogs: list[int], uncleaned: int
) -> list[dict[str, Any]]:
    points = []
    for backlog in backlogs:
        reset_outbox(url)
        topic, rows = create_topic(bootstrap), max(backlog, events)
        fill_outbox(url, topic, rows)
        point = {
            "what": "backlog",
            "rows": backlog,
            **publish(url, bootstrap, f"scale-{uuid.uuid4().hex[:6]}", rows),
        }
        points.append(point)
        print(f"relay, catching up on {rows:>10,} rows: {_rate(point)}", flush=True)
    reset_outbox(url)
    topic, name = create_topic(bootstrap), f"scale-{uuid.uuid4().hex[:6]}"
    fill_outbox(url, topic, uncleaned)
    publish(url, bootstrap, name, uncleaned)  # published, and left in the table
    fill_outbox(url, topic, events)
    point = {"what": "uncleaned", "rows": uncleaned, **publish(url, bootstrap, name, events)}
    points.append(point)
    print(f"relay, {events:,} new rows beside {uncleaned:,} published: {_rate(point)}", flush=True)
    reset_outbox(url)
    return points


def reset_outbox(url: DatabaseUrl) -> None:
    """An empty outbox, no relay's position holding cleanup back, its space given back."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute("TRUNCATE outbox_events, relay_positions")
        conn.execute("VACUUM ANALYZE outbox_events")


# -- Spark: the sink and kafka_rc -----------------------------------------------------------------


def fill_table(url: DatabaseUrl, table: str, have: int, want: int) -> None:
    """Grow `table` from `have` to `want` rows (random uuid keys, as events' ids are), then vacuum.
    Its key's index is built again after, by one sort, not row by row."""
    if want <= have:
        return
    name, key = sql.Identifier(table), sql.Identifier(f"{table}_pkey")
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(name, key))
        for start in range(have, want, 1_000_000):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT gen_random_uuid(), g, (g %% 100000) / 100.0, repeat('x', 100)"
                    " FROM generate_series(%s, %s) AS g"
                ).format(name),
                [start + 1, min(want, start + 1_000_000)],
            )
        conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (event_id)").format(name))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(name))


def spark_curves(
    url: DatabaseUrl,
    bootstrap: str,
    work: Path,
    count: int,
    size: int,
    table_rows: list[int],
    partitions: list[int],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from outbox_dev.local_spark import kafka_connector_jars, local_session, stop_session
    from sinks.kafka_source import register
    from sinks.postgres import PostgresSink, parse_json

    per_batch = -(-count // 5)

    def topic_of(parts: int) -> str:
        rows = events(count, size).to_pylist()
        for row in rows:
            row["event_id"] = str(uuid.uuid4())  # new ids each point: every event is a fresh row
        topic = f"bench.scale.{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, ((r["event_id"].encode(), json.dumps(r).encode()) for r in rows), parts)
        return topic

    spark = local_session(work, app_name="bench-scale", jars=kafka_connector_jars())
    sink_points, source_points = [], []
    try:
        register(spark)

        def read(source: str, topic: str):  # type: ignore[no-untyped-def]
            return stream(spark, source, bootstrap, topic, per_batch)

        with psycopg.connect(url.libpq, autocommit=True) as conn:
            conn.execute(TABLE.format("bench_scale"))
            conn.execute(TABLE.format("bench_scale_warm"))
        # The JVMs' first reads and the first sink run are slower (JIT): one unmeasured pass first,
        # so that the smallest point, which the others are held against, does not pay for it.
        warm = parse_json(read("kafka", topic_of(2)), SCHEMA, key_column="event_id")
        sink_run(warm, PostgresSink("bench_scale_warm", url=url.raw).writer(warm), work / "chk-warm", count)
        have = 0
        for rows in table_rows:
            fill_table(url, "bench_scale", have, rows)
            have = rows
            frame = parse_json(read("kafka", topic_of(2)), SCHEMA, key_column="event_id")
            writer = PostgresSink("bench_scale", url=url.raw, name=f"scale_{rows}").writer(frame)
            settle(url)
            measured, batches = sink_run(frame, writer, work / f"chk-sink-{rows}", count)
            steady = batches[1:] or batches
            staged = sum(b.staged for b in steady) or 1
            stages = {s: sum(b.stages.get(s, 0.0) for b in steady) / staged * 1e6 for s in STAGES}
            point = {"rows": rows, "per_s": measured["steady_per_s"], "stages_us": stages}
            point["us_per_event"] = 1e6 / point["per_s"]
            sink_points.append(point)
            print(f"sink, into a table of {rows:>10,} rows: {_rate(point)}", flush=True)
            have += count

        def noop(batch, _: int) -> None:  # type: ignore[no-untyped-def]
            batch.write.format("noop").mode("append").save()

        slots = spark.sparkContext.defaultParallelism
        for parts in partitions:
            topic = topic_of(parts)
            made = consumer_seconds(bootstrap, topic)
            tasks = packed_tasks(topic, parts, per_batch)
            empty = task_seconds(spark, tasks)
            ours = run(read("kafka_rc", topic), noop, work / f"chk-rc-{parts}", count)
            theirs = run(read("kafka", topic), noop, work / f"chk-kafka-{parts}", count)["steady_per_s"]
            point = {
                "partitions": parts,
                "per_s": ours["steady_per_s"],
                "us_per_event": 1e6 / ours["steady_per_s"],
                "spark_per_s": theirs,
                "consumer_ms": round(made * 1000, 1),
                "empty_job_ms": round(empty * 1000, 1),
                "tasks_per_batch": tasks,
            }
            # kafka_rc makes a consumer for each range (a partition of a micro-batch) and closes it
            # after; Spark's source keeps its consumers in a pool. What those consumers cost per
            # event, on `slots` task slots; what Spark charges for the micro-batches' tasks
            # themselves, read nothing; and the rest: which one grows with partitions.
            rows = max(1, ours["rows_all"])
            consumers = parts * ours["batches"] * made / slots / rows * 1e6
            spark_tasks = ours["batches"] * empty / rows * 1e6
            point["stages_us"] = {
                "consumers": consumers,
                "Spark's tasks": spark_tasks,
                "the rest": point["us_per_event"] - consumers - spark_tasks,
            }
            source_points.append(point)
            print(
                f"kafka_rc, {parts:>2} partitions: {_rate(point)}; Spark's own source {theirs:,.0f} events/s"
                f" ({1e6 / theirs:.1f} us/event); a consumer made, first record, closed:"
                f" {point['consumer_ms']} ms; {tasks} empty Python tasks: {point['empty_job_ms']} ms a job;"
                f" {tasks} tasks a micro-batch on {slots} slots",
                flush=True,
            )
    finally:
        stop_session(spark)
    return sink_points, source_points


def sink_run(frame: Any, writer: Any, checkpoint: Path, count: int) -> tuple[dict, list]:
    """The sink's run of `frame` and its batches' results."""
    each = Recorded(writer)
    return run(frame, each, checkpoint, count, each.sizes), each.results


def packed_tasks(topic: str, partitions: int, per_batch: int) -> int:
    """The tasks of a micro-batch that reads `per_batch` records evenly from `partitions`, as
    kafka_rc packs them by default."""
    share = per_batch // partitions
    rngs = [Range(topic, p, 0, share) for p in range(partitions)]
    return len(pack(rngs, MIN_RECORDS_PER_TASK.default))


def task_seconds(spark: Any, tasks: int, times: int = 5) -> float:
    """Spark's own cost of a micro-batch's `tasks` Python tasks, none reading anything: seconds per job
    of that many empty mapInArrow tasks (kafka_rc's reads run in Python workers too), after one
    unmeasured job (median of `times`)."""

    def nothing(batches):  # type: ignore[no-untyped-def]
        return (b.slice(0, 0) for b in batches)

    job = spark.range(0, tasks, 1, tasks).mapInArrow(nothing, "id long").write.format("noop").mode("append")
    job.save()
    spent = []
    for _ in range(times):
        began = time.perf_counter()
        job.save()
        spent.append(time.perf_counter() - began)
    return sorted(spent)[len(spent) // 2]


def consumer_seconds(bootstrap: str, topic: str, times: int = 10) -> float:
    """What a kafka_rc task pays around its records, timed in the driver (median of `times`): a
    consumer made with the reader's settings, assigned one partition, its first record read, closed."""
    from confluent_kafka import Consumer, TopicPartition

    from sinks.kafka_source.options import parse

    config = parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}).consumer_config()
    spent = []
    for _ in range(times):
        began = time.perf_counter()
        consumer = Consumer(config)
        consumer.assign([TopicPartition(topic, 0, 0)])
        while consumer.poll(1.0) is None:
            pass
        consumer.close()
        spent.append(time.perf_counter() - began)
    return sorted(spent)[len(spent) // 2]


# -- the report -----------------------------------------------------------------------------------


def _rate(point: dict[str, Any]) -> str:
    stages = point.get("stages_us") or {}
    detail = " | ".join(f"{k} {v:.1f}" for k, v in stages.items())
    return f"{point['per_s']:>9,.0f} events/s, {point['us_per_event']:6.1f} us/event" + (
        f" (by stage, us/event: {detail})" if detail else ""
    )


def verdict(curve: str, points: list[dict[str, Any]], x: str) -> dict[str, Any]:
    """The largest point's cost per event over the smallest's, against AIM, and the stage that grew most."""
    small, large = points[0], points[-1]
    ratio = large["us_per_event"] / small["us_per_event"]
    grew = {
        stage: large["stages_us"][stage] - small["stages_us"].get(stage, 0.0)
        for stage in large.get("stages_us", {})
    }
    most = max(grew, key=lambda k: grew[k]) if grew else None
    return {
        "curve": curve,
        "from": small[x],
        "to": large[x],
        "ratio": round(ratio, 3),
        "aim": AIM,
        "met": ratio <= AIM,
        "grew_most": most,
        "grew_us": round(grew[most], 2) if most else None,
    }


def report(result: dict[str, Any]) -> list[dict[str, Any]]:
    backlog = [p for p in result["relay"] if p["what"] == "backlog"]
    curves = [
        ("sink: rows in the table", result["sink"], "rows"),
        ("relay: rows waiting in the outbox", backlog, "rows"),
        ("kafka_rc: partitions", result["kafka_rc"], "partitions"),
    ]
    verdicts = [verdict(name, points, x) for name, points, x in curves if points]
    if result["kafka_rc"]:
        spark = result["kafka_rc"][-1]["spark_per_s"] / result["kafka_rc"][0]["spark_per_s"]
        verdicts.append(
            {
                "curve": "Spark's own source: partitions (the peer)",
                "ratio": round(1 / spark, 3),
                "aim": AIM,
                "met": 1 / spark <= AIM,
            }
        )
    uncleaned = next((p for p in result["relay"] if p["what"] == "uncleaned"), None)
    if uncleaned and backlog:
        ratio = uncleaned["us_per_event"] / backlog[0]["us_per_event"]
        verdicts.append(
            {
                "curve": "relay: beside published rows not cleaned",
                "ratio": round(ratio, 3),
                "aim": AIM,
                "met": ratio <= AIM,
            }
        )
    print(
        f"the cost per event at the largest point over the smallest's (aim <= {AIM});"
        f" {result['seconds']} s in all:"
    )
    for v in verdicts:
        grew = f"; grew most: {v['grew_most']} (+{v['grew_us']} us/event)" if v.get("grew_most") else ""
        print(f"  {v['curve']:<42}: {v['ratio']:>6} {'met' if v['met'] else 'NOT met'}{grew}")
    return verdicts


def draw(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backlog = [p for p in result["relay"] if p["what"] == "backlog"]
    curves = [
        (title, points, x)
        for title, points, x in (
            ("the sink: rows already in the table", result["sink"], "rows"),
            ("the relay: rows waiting in the outbox", backlog, "rows"),
            ("kafka_rc: partitions", result["kafka_rc"], "partitions"),
        )
        if points
    ]
    figure, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4.5), squeeze=False)
    axes = axes[0]
    for ax, (title, points, x) in zip(axes, curves, strict=True):
        xs = [p[x] for p in points]
        ax.plot(xs, [p["us_per_event"] for p in points], marker="o", label="ours")
        if "spark_per_s" in points[0]:
            ax.plot(xs, [1e6 / p["spark_per_s"] for p in points], marker="s", label="Spark's own source")
            ax.legend()
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.set_ylabel("us per event")
        highest = max(max(p["us_per_event"], 1e6 / p.get("spark_per_s", math.inf)) for p in points)
        ax.set_ylim(bottom=0, top=highest * 1.25)  # room for the labels
        for px, p in zip(xs, points, strict=True):
            ax.annotate(
                f"{p['per_s']:,.0f}/s", (px, p["us_per_event"]), textcoords="offset points", xytext=(0, 6)
            )
    figure.suptitle(f"cost per event as the work grows ({result['events']:,} events a point)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
