"""The sink bench's report: each run's rate, CPU, Spark phases and stages, and the ratios between
runs, printed and gathered into the JSON object."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sink_bounds import avro_bound, ceilings, cpu_by_process, machine_bounds  # bench/sink_bounds.py
from sink_plan import SINKS  # bench/sink_plan.py
from sink_ratios import Ratios, ratio  # bench/sink_ratios.py


def report(
    args: argparse.Namespace,
    base: dict[str, Any],
    tracing: dict[str, float],
    decode: dict[str, float],
    runs: dict[str, dict[str, Any]],
) -> dict[str, object]:
    """Prints the figures, part by part; returns them as the JSON object.

    base: psycopg alone (the limit); tracing: trace_cost's; decode: avro_decode's (empty without Avro)."""
    ratios = Ratios(runs)
    result = headline(args, base, decode, ratios)
    lines = run_lines(base, ratios)
    print_rates(lines, base, runs)
    print_ratios(result, ratios.spread, runs)
    source_reads(result, runs)
    machine_bounds(result, lines, base, runs)
    cpu_by_process(result, lines, base, runs)
    gc_and_phases(result, lines, runs)
    print_sink_batches(runs)
    time_breakdown(result, ratios)
    tracing_share(result, tracing, runs)
    ceilings(result, base, ratios)
    if "sink_avro" in runs:
        avro_bound(result, base, decode, ratios)
    result["rounds"] = args.rounds
    result["ratio_rounds"] = ratios.spread
    return result


def headline(
    args: argparse.Namespace, base: dict[str, Any], decode: dict[str, float], ratios: Ratios
) -> dict[str, object]:
    """Each run's rate and CPU per row, and the ratios the targets name."""
    runs, steady, paired = ratios.runs, ratios.steady, ratios.paired
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
    return result


def run_lines(base: dict[str, Any], ratios: Ratios) -> list[tuple[str, str, float]]:
    """Each run's line: its label, its name and its steady rate; psycopg's, the limit, first."""
    runs, steady, limit = ratios.runs, ratios.steady, base["steady_per_s"]
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
    return lines


def print_rates(lines: list[tuple[str, str, float]], base: dict[str, Any], runs: dict[str, Any]) -> None:
    """Each run's steady rate and the machine's CPU per row."""
    print(f"{'':<42}  {'rows/s':>10}  {'CPU us/row':>10}")
    for label, name, value in lines:
        cpu = base["cpu_us_per_row"] if name == "psycopg" else runs[name]["cpu_us_per_row"]
        print(f"{label:<42}: {value:>10,.0f}  {cpu:>10.1f}")


def print_ratios(result: dict[str, object], spread: dict[str, list[float]], runs: dict[str, Any]) -> None:
    """Each ratio, with its target and its value in each round."""
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


def source_reads(result: dict[str, object], runs: dict[str, Any]) -> None:
    """The runs that read their source more than once (their rows are counted once)."""
    twice = {name: run["source_reads"] for name, run in runs.items() if run["source_reads"] != 1}
    result["source_reads"] = twice
    if twice:
        print(
            f"read their source more than once (a range repartition samples it first): {twice};"
            " each row counted once"
        )


def gc_and_phases(
    result: dict[str, object], lines: list[tuple[str, str, float]], runs: dict[str, Any]
) -> None:
    """The Spark JVM's garbage collection per row, and a steady batch's phases as Spark times them."""
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


def print_sink_batches(runs: dict[str, Any]) -> None:
    """Each sink run's batches: the slowest task's copy and apply seconds."""
    print("per batch, slowest task's copy / apply seconds (on the driver: stage job / apply):")
    for name in (n for n in SINKS if n in runs):
        detail = " ".join(f"{b['stage_s']:.2f}/{b['apply_s']:.2f}" for b in runs[name]["batches_detail"])
        print(f"  {name:<12} {detail}")


def time_breakdown(result: dict[str, object], ratios: Ratios) -> None:
    # Where the time goes: each writer's task seconds per event and stage (summed over its tasks,
    # so up to the cores' count times the wall time), beside its wall time per event; and the
    # source alone, without and with Spark's conversion to Arrow, in wall time per event.
    runs, steady = ratios.runs, ratios.steady
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


def tracing_share(result: dict[str, object], tracing: dict[str, float], runs: dict[str, Any]) -> None:
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


def unwritten(runs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The runs (round by round) whose table does not hold every event, printed as an error."""
    every = [
        (f"{name} round {k}", r)
        for name, run in runs.items()
        for k, r in enumerate(run.get("rounds", [run]), 1)
    ]
    wrong = {name: r["written"] for name, r in every if "written" in r and r["written"] != args.events}
    if wrong:
        print(f"ERROR: rows written, expected {args.events}: {wrong}", file=sys.stderr)
    return wrong
