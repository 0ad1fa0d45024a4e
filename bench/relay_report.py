"""The relay bench's report: the rounds' medians and ratios, the latency runs and the faults, printed
and gathered into the JSON object."""

from __future__ import annotations

import os
import statistics

from relay_faults import FAULTS, _lost  # bench/relay_faults.py
from relay_latency import _lat  # bench/relay_latency.py
from relay_peers import LABELS, PEERS, RUN_LABELS, RUNS  # bench/relay_peers.py
from relay_rounds import bound  # bench/relay_rounds.py

from outbox.relay.metrics import STEPS as RELAY_STEPS


class Rounds:
    """The counted rounds: a publisher's median rate and CPU per event, and a ratio of two in each."""

    def __init__(self, rounds: list) -> None:
        self.rounds = rounds

    def rate(self, who: str) -> int:
        return round(statistics.median(r[who]["steady_per_s"] for r in self.rounds))

    def ratios(self, a: str, b: str) -> list[float]:
        return [round(r[a]["steady_per_s"] / r[b]["steady_per_s"], 3) for r in self.rounds]

    def cpu(self, who: str) -> float:
        return _round(statistics.median(r[who]["cpu_us_per_event"] or 0 for r in self.rounds))


def report(result: dict) -> dict:
    """Prints the figures; returns them as the JSON object."""
    counted = Rounds(result["rounds"])
    out = throughput_figures(result, counted)
    out |= latency_figures(result)
    out |= {kind: result[kind] for kind in FAULTS}
    beside(out, counted)
    print_throughput(out, counted)
    print_ratios(out)
    print_latency(out, counted)
    for kind, (what, _) in FAULTS.items():
        for who, f in out[kind].items():
            print(f"kill -9 {what}, {LABELS.get(who, who)}: {_lost(f)}")
    return out


def throughput_figures(result: dict, counted: Rounds) -> dict:
    """The rounds' medians: each publisher's rate and CPU, the relay's ratios and where its time went,
    and the bound the machine sets."""
    rounds, median = counted.rounds, statistics.median
    rate, ratios, cpu = counted.rate, counted.ratios, counted.cpu
    eos_vs_raw, eos_vs_alo = ratios("eos", "raw"), ratios("eos", "alo")
    bounds = [bound(r) for r in rounds]
    known = [b for b in bounds if b is not None]
    cores = os.cpu_count() or 1
    return {
        "events": result["args"]["events"],
        "event_bytes": result["args"]["size"],
        "batch_size": result["args"]["batch_size"],
        "rounds": len(rounds),
        "warmup_rounds": result["args"]["warmup"],
        "timed_at": "a read_committed reader in its own process, from the first batch read to the last",
        **{f"{name}_per_s": rate(who) for who, name in RUNS.items()},
        "ratio_relay_vs_raw": round(median(eos_vs_raw), 3),
        "target_vs_raw": 1.0,
        "exactly_once_cost": round(median(1 - x for x in eos_vs_alo), 3),
        "target_exactly_once_cost": 0.10,
        "ratio_rounds": {
            "ratio_relay_vs_raw": eos_vs_raw,
            "exactly_once_cost": [round(1 - x, 3) for x in eos_vs_alo],
            "bound_ratio_relay_vs_raw": bounds,
        },
        # Each counted round's rates, in the order the rounds ran.
        "rounds_per_s": {name: [round(r[who]["steady_per_s"]) for r in rounds] for who, name in RUNS.items()},
        # CPU in the steady state, the machine's (broker, PostgreSQL, the reader included), and by
        # whom; start-up apart.
        **{f"{name}_cpu_us_per_event": cpu(who) for who, name in RUNS.items()},
        "cpu_us_by_component": {
            name: rounds[len(rounds) // 2][who]["cpu_us_by_component"] for who, name in RUNS.items()
        },
        "cores_busy": {
            name: round(median(r[who]["cores_busy"] or 0 for r in rounds), 2) for who, name in RUNS.items()
        },
        "startup_s": {
            name: round(median(r[who]["startup_s"] for r in rounds), 2) for who, name in RUNS.items()
        },
        # Where the relay's publishing thread spent its time, us per event (its step counters).
        "relay_steps_us_per_event": {
            name: {
                step: round(median(r[who]["steps_us_per_event"].get(step, 0.0) for r in rounds), 2)
                for step in RELAY_STEPS
            }
            for who, name in RUNS.items()
            if who != "raw"
        },
        # The most this machine gives each, all its cores busy at that CPU cost per event.
        "bound_per_s": {name: round(cores * 1e6 / cpu(who)) for who, name in RUNS.items() if cpu(who)},
        # The least CPU per event a relay that reads the rows into Python spends: the raw producer's,
        # and the same rows read alone (relay_peers.read_alone). All cores busy at that cost, the best
        # relay / raw (`bound`): below 1.0 in a round, no such relay meets the target there.
        "read_alone_cpu_us_per_event": cpu("read"),
        "floor_cpu_us_per_event": _round(cpu("raw") + cpu("read")),
        "bound_ratio_relay_vs_raw": round(median(known), 3) if len(known) == len(bounds) else None,
        "cpu_us_per_event_for_raw": round(cores * 1e6 / rate("raw"), 1),
    }


def latency_figures(result: dict) -> dict:
    """Each latency run's figures, and the relay's worst p99 at each rate."""
    worst = {  # the relay's worst round at each rate: the target holds in every round or not at all
        rate: max((e["relay"] for e in result["latency"] if e["rate"] == rate), key=lambda v: v["p99_ms"])
        for rate in sorted({e["rate"] for e in result["latency"]})
    }
    return {
        "latency": [
            {
                "rate_per_s": e["rate"],
                "round": e["round"],
                **{k: _lat(v) for k, v in e.items() if k in ("relay", "relay_no_cleanup", *PEERS)},
            }
            for e in result["latency"]
        ],
        "relay_p99_ms_worst": {str(rate): round(e["p99_ms"], 1) for rate, e in worst.items()},
        # How full the machine was in that round: a tail on all cores busy is the machine's bound.
        "relay_p99_worst_cores_busy": {str(rate): e["cores_busy"] for rate, e in worst.items()},
        "target_p99_ms": {"1000": 100, "10000": 250},
    }


def beside(out: dict, counted: Rounds) -> None:
    """The three-broker cluster's figures and Debezium's, where they ran."""
    rounds, median = counted.rounds, statistics.median
    rate, ratios, cpu = counted.rate, counted.ratios, counted.cpu
    if "eos_rf3" in rounds[0]:
        out |= {
            "rf3_raw_producer_per_s": rate("raw_rf3"),
            "rf3_relay_exactly_once_per_s": rate("eos_rf3"),
            "rf3_relay_cpu_us_per_event": cpu("eos_rf3"),
            "ratio_rf3_vs_1_raw": median(ratios("raw_rf3", "raw")),
            "ratio_rf3_vs_1_relay": median(ratios("eos_rf3", "eos")),
            "ratio_rf3_relay_vs_rf3_raw": median(ratios("eos_rf3", "raw_rf3")),
        }
    for name in (n for n in PEERS if n in rounds[0]):
        out |= {
            f"{name}_per_s": rate(name),
            f"ratio_relay_vs_{name}": median(ratios("eos", name)),
            f"{name}_cpu_us_per_event": cpu(name),
            f"{name}_startup_s": round(median(r[name]["startup_s"] for r in rounds), 2),
        }
        out["ratio_rounds"][f"ratio_relay_vs_{name}"] = ratios("eos", name)
    if any(n in rounds[0] for n in PEERS):
        out["target_vs_debezium"] = 2.0


def print_throughput(out: dict, counted: Rounds) -> None:
    """Each publisher's rate, CPU, busy cores, bound and start-up; where the relays' time went."""
    rounds, cores = counted.rounds, os.cpu_count() or 1
    print(
        f"medians of {len(rounds)} rounds (after {out['warmup_rounds']} uncounted), {out['events']:,} events"
        f" of {out['event_bytes']} B, each timed at a read_committed reader; CPU is the machine's in the"
        " steady state (broker, PostgreSQL and the reader included):"
    )
    for who, name in RUNS.items():
        print(
            f"{RUN_LABELS[who]:<27}: {out[f'{name}_per_s']:>9,} events/s, {out[f'{name}_cpu_us_per_event']}"
            f" us CPU/event, {out['cores_busy'][name]} of {cores} cores busy; the machine's bound at that"
            f" cost {out['bound_per_s'].get(name, 0):,}/s; start-up {out['startup_s'][name]} s"
        )
    for name, steps in out["relay_steps_us_per_event"].items():
        cells = ", ".join(f"{step} {us}" for step, us in steps.items())
        print(f"  {name.replace('_', ' ')}, its publishing thread, us per event: {cells}")


def print_ratios(out: dict) -> None:
    """Debezium's rates and the relay's ratios, each with its target and rounds, and the bound the
    machine sets; the cluster's."""
    cores = os.cpu_count() or 1
    eos_vs_raw = out["ratio_rounds"]["ratio_relay_vs_raw"]
    for name in (n for n in PEERS if f"{n}_per_s" in out):
        print(
            f"{LABELS[name] + ' (Connect)':<27}: {out[f'{name}_per_s']:>9,} events/s,"
            f" {out[f'{name}_cpu_us_per_event']} us CPU/event; start-up {out[f'{name}_startup_s']} s"
        )
        print(
            f"{'relay / ' + LABELS[name]:<27}: {out[f'ratio_relay_vs_{name}']:>9} (target >= 2.0;"
            f" rounds {out['ratio_rounds'][f'ratio_relay_vs_{name}']})"
        )
    bounds = out["ratio_rounds"]["bound_ratio_relay_vs_raw"]
    print(
        f"relay / raw                : {out['ratio_relay_vs_raw']:>9} (target >= 1.0 in every round;"
        f" rounds {eos_vs_raw})"
    )
    print(
        f"  the machine allows at most: {out['bound_ratio_relay_vs_raw']} (rounds {bounds}): {cores} cores"
        f" busy at the raw producer's {out['raw_producer_cpu_us_per_event']} us CPU per event plus"
        f" {out['read_alone_cpu_us_per_event']} to read the rows into Python alone; 1.0 needs at most"
        f" {out['cpu_us_per_event_for_raw']} us per event in all"
        + ("; so the target is out of reach here" if all(b is not None and b < 1 for b in bounds) else "")
    )
    print(
        f"cost of exactly-once       : {out['exactly_once_cost']:>9.1%} (target <= 10%;"
        f" rounds {out['ratio_rounds']['exactly_once_cost']})"
    )
    if "ratio_rf3_vs_1_relay" in out:
        print(
            f"RF 3 cluster (3 brokers)   : raw {out['rf3_raw_producer_per_s']:,}/s,"
            f" relay {out['rf3_relay_exactly_once_per_s']:,}/s,"
            f" {out['rf3_relay_cpu_us_per_event']} us CPU/event (machine-wide)"
        )
        print(
            f"RF 3 / one broker          : raw {out['ratio_rf3_vs_1_raw']},"
            f" relay {out['ratio_rf3_vs_1_relay']} (the cost of replication);"
            f" on RF 3, relay / raw {out['ratio_rf3_relay_vs_rf3_raw']}"
        )


def print_latency(out: dict, counted: Rounds) -> None:
    """Each latency run's figures, and the relay's worst p99 at each rate beside its target."""
    rounds = counted.rounds
    for e in out["latency"]:
        latency_cells = [
            f"{who.replace('_', ' ')} p50 {v['p50_ms']} p99 {v['p99_ms']} max {v['max_ms']} ms"
            f" ({v['rate_per_s']}/s reached, {v['missing']} not seen)"
            for who, v in e.items()
            if isinstance(v, dict)
        ]
        print(f"commit-to-visible at {e['rate_per_s']}/s, round {e['round']}: " + "; ".join(latency_cells))
    for rate, p99 in out["relay_p99_ms_worst"].items():
        target, busy = out["target_p99_ms"].get(rate), out["relay_p99_worst_cores_busy"][rate]
        print(
            f"relay p99 at {rate}/s, worst of {len(rounds)} rounds: {p99} ms (target <= {target} ms);"
            f" {busy} of {os.cpu_count()} cores busy in that round"
        )


def _round(x: float) -> float:
    return round(x, 1)
