"""The machine's share of each sink run (its CPU accounting): each run's bound and busy cores, its CPU
per row by process, and the ceiling and bound the machine leaves the sink beside each peer."""

from __future__ import annotations

import os
from typing import Any

from cpu import COMPONENTS, DRIVER  # bench/cpu.py
from sink_ratios import Ratios  # bench/sink_ratios.py


def machine_bounds(
    result: dict[str, object], lines: list[tuple[str, str, float]], base: dict[str, Any], runs: dict[str, Any]
) -> None:
    """Each run's bound (all the cores at its CPU per row), and the share of the cores it kept busy."""
    cores = os.cpu_count() or 1
    print(f"the machine's bound for each run: {cores} cores / its CPU per row; busy: the cores' share used")
    result["machine_cores"] = cores
    for label, name, _ in lines:
        whole = base if name == "psycopg" else runs[name]
        cpu = whole["cpu_us_per_row"]
        bound, busy = cores * 1e6 / cpu, whole["steady_per_s"] * cpu / (cores * 1e6)
        print(f"  {label:<40}: bound {bound:>10,.0f} rows/s, busy {busy:>4.0%}")


def cpu_by_process(
    result: dict[str, object], lines: list[tuple[str, str, float]], base: dict[str, Any], runs: dict[str, Any]
) -> None:
    """Each run's machine CPU per row, by process."""
    who = [c for c, _ in COMPONENTS] + [DRIVER, "other"]
    print("CPU us/row by process, steady batches:", " | ".join(who))
    result["cpu_us_per_row_by"] = {"psycopg": base["cpu_us_per_row_by"]}
    for label, name, _ in lines:
        by = base["cpu_us_per_row_by"] if name == "psycopg" else runs[name]["cpu_us_per_row_by"]
        result["cpu_us_per_row_by"][name] = by  # type: ignore[index]
        print(f"  {label:<40}: " + " | ".join(f"{by.get(c, 0.0):>5.1f}" for c in who))


def ceilings(result: dict[str, object], base: dict[str, Any], ratios: Ratios) -> None:
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
    cores = os.cpu_count() or 1
    runs = ratios.runs
    reads_kafka = "its tasks read" in str(runs["sink"].get("route", ""))
    kafka_feed = "tasks_read_kafka" if reads_kafka else "source_arrow"
    for feed, arrow, peers in (
        ("Kafka", kafka_feed, ("jdbc", "hand")),
        ("Parquet", "source_memory_arrow", ("jdbc_memory", "hand_memory")),
    ):
        feed_ceiling(result, base, ratios, cores, feed, arrow, peers)


def feed_ceiling(
    result: dict[str, object],
    base: dict[str, Any],
    ratios: Ratios,
    cores: int,
    feed: str,
    arrow: str,
    peers: tuple[str, ...],
) -> None:
    """From one feed (`arrow`: its floor's run): the sink's ceiling and bound, and each as a ratio to
    each peer's rate, within each round."""
    runs, steady, across = ratios.runs, ratios.steady, ratios.across
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


def avro_bound(
    result: dict[str, object], base: dict[str, Any], decode: dict[str, float], ratios: Ratios
) -> None:
    # Avro: the sink's tasks decode each value in Python (fastavro), which the peers' from_avro
    # does in the JVM. Its floor: the peer's frame handed to Python as Arrow (a feed no cheaper
    # than the sink's raw one), the decode alone (avro_decode, one process), the bare COPY +
    # upsert; the bound is the cores over it, as a ratio to each peer's rate, round by round.
    cores = os.cpu_count() or 1
    runs, across = ratios.runs, ratios.across
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
