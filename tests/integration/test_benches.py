"""The benches run end to end at a small size and end with their figures.

A bench that breaks does so silently: the scale bench failed for two sessions
once the sink's tasks began to read Kafka themselves (Spark's progress counts
no input row there), and nothing ran it. Here each runs against the session's
PostgreSQL and broker, and its last JSON line must hold what the docs quote
from it. No figure is held to a bound: timing is the benches' business.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from outbox.core.config import DatabaseUrl
from tests.helpers import Job

# Each at a size that runs in a minute or so; the sink's runs have two batches, the smallest with a
# steady one. Flags that need what CI does not run (a three-broker cluster, Debezium's Connect
# worker) are off.
BENCHES = {
    "sink": [
        *("bench/sink.py", "--events", "3000", "--no-cluster", "--rounds", "1", "--batches", "2"),
        "--no-warmup",
    ],
    "relay": [
        *("bench/relay.py", "--events", "10000", "--batch-size", "500", "--rounds", "1", "--no-cluster"),
        *("--no-debezium", "--warmup", "0", "--rates", "500", "--seconds", "2"),
        *("--fault-seconds", "4", "--fault-events", "5000"),
    ],
    "debezium_layout": ["bench/debezium_layout.py", "--events", "3000", "--no-debezium"],
    "scale": [
        *("bench/scale.py", "--events", "20000", "--table-rows", "0,20000", "--backlogs", "0,20000"),
        *("--uncleaned", "20000", "--partitions", "1,2", "--png", ""),
    ],
}
# What each bench's JSON must hold, as the docs and the targets name it.
KEYS = {
    "sink": (
        *("ratio_sink_vs_jdbc", "ratio_sink_vs_hand", "ratio_sink_memory_vs_jdbc_memory", "breakdown"),
        *("ratio_sink_avro_vs_jdbc", "bound_ratio_sink_avro_vs_jdbc", "avro_decode_us_per_event"),
    ),
    "relay": (
        *("ratio_relay_vs_raw", "bound_ratio_relay_vs_raw", "exactly_once_cost", "relay_steps_us_per_event"),
        *("latency", "faults"),
    ),
    "scale": ("sink", "relay", "kafka_rc", "verdicts"),
    "debezium_layout": ("copy", "insert"),
}


def figures(output: str) -> dict[str, Any]:
    """The bench's JSON line: its last line that is a JSON object (Spark may log after it)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    raise AssertionError(f"no JSON line:\n{output[-4000:]}")


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_a_bench_runs_and_ends_with_its_figures(
    bench: str, database: DatabaseUrl, bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = {"DATABASE_URL": database.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "TMPDIR": str(tmp_path)}
    if bench == "sink":  # the session's registry, rather than one more started and stopped for the bench
        env["SCHEMA_REGISTRY_URL"] = request.getfixturevalue("registry").url
    job = Job([*BENCHES[bench], "--json"], tmp_path / f"{bench}.log", env)
    try:
        assert job.wait(540) == 0, job.output()[-6000:]
    finally:
        job.kill9()
    found = figures(job.output())
    missing = [k for k in KEYS[bench] if k not in found]
    assert not missing, (missing, sorted(found))
    if bench == "relay":  # the relay's own step counters reached the bench: each publishing step timed
        steps = found["relay_steps_us_per_event"]["relay_exactly_once"]
        assert all(steps[step] > 0 for step in ("read", "produce", "commit")), steps
    if bench == "scale":
        points = [p for curve in ("sink", "relay", "kafka_rc") for p in found[curve]]
        assert points and all(p["per_s"] > 0 for p in points), points
    elif bench == "debezium_layout":  # a loss count, no rate: the relay's runs, each event once
        runs = [found[how]["relay"] for how in ("copy", "insert")]
        assert all(r["committed"] == 3000 and r["missing"] == r["duplicates"] == 0 for r in runs), runs
    else:
        ratios = {k: v for k, v in found.items() if k.startswith("ratio_") and isinstance(v, float)}
        assert ratios and all(math.isfinite(v) and v > 0 for v in ratios.values()), ratios
