"""The demos end to end: the smoke run, and the whole loop under chaos (`make demo`)."""

import json
from pathlib import Path

import pytest

from outbox.core.config import DatabaseUrl
from outbox_dev.process import cmdline_contains
from tests.helpers import Job


def test_smoke_demo_applies_every_committed_event_once(
    server_url: DatabaseUrl, bootstrap: str, tmp_path: Path
) -> None:
    work = tmp_path / "demo"
    job = Job(
        ["-m", "demos.smoke", "--events", "300", "--dir", str(work)],
        tmp_path / "demo.log",
        {"DATABASE_URL": server_url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
    )
    assert job.wait(300) == 0, job.output()
    out = job.output()
    assert "300 rows; missing 0, unexpected 0, wrong amount 0" in out
    assert "OK: every committed event applied once" in out
    assert not work.exists(), "the demo must delete its scratch directory"


# The Connect and Avro form is left to `make soak`: Spark Connect's and Avro's kill -9s each have
# tests of their own in `make test` (test_connect_faults.py, test_sink_avro_faults.py).
@pytest.mark.parametrize("mode", ["classic", pytest.param("connect-avro", marks=pytest.mark.soak)])
def test_the_loop_under_chaos_delivers_every_committed_event_once_in_order(
    server_url: DatabaseUrl, tmp_path: Path, mode: str
) -> None:
    """`make demo` in small: kill -9 the Spark job and the relay twice each, the broker once; and
    `make demo CONNECT=1 FORMAT=avro`, the Spark job a Connect client whose server is killed -9
    with it, the input Avro under the demo's own schema registry."""
    work, chart = tmp_path / "loop", tmp_path / "loop.png"
    kills = {"spark": 2, "relay": 2, "broker": 1}
    job = Job(
        [
            "-m",
            "demos.loop",
            "--events",
            "3000",
            "--duration",
            "30",
            "--accounts",
            "40",
            "--spark-kills",
            "2",
            "--relay-kills",
            "2",
            "--broker-restarts",
            "1",
            "--dir",
            str(work),
            "--chart",
            str(chart),
            "--json",
            *(["--connect", "--format", "avro"] if mode == "connect-avro" else []),
        ],
        tmp_path / "loop.log",
        # A broker of the demo's own, so that it can restart it.
        {"DATABASE_URL": server_url.raw, "KAFKA_BOOTSTRAP_SERVERS": "", "SCHEMA_REGISTRY_URL": ""},
    )
    code = job.wait(900)
    out = job.output()
    verdict = json.loads(out.strip().splitlines()[-1])
    assert code == 0, out
    assert verdict["ok"] and verdict["killed"] == kills, out
    assert verdict["committed_in"] == verdict["applied"] == verdict["published"] == 3000, out
    assert verdict["redelivered_in"] > 0, "the input must have redeliveries for the test to mean anything"
    for fault in ("duplicates", "missing", "out_of_order", "leaked", "wrong"):
        assert verdict[fault] == 0, (fault, out)
    # `outbox trace` of an event the Spark job was killed with, and of the poison one.
    assert [t["ok"] for t in verdict["traces"]] == [True, True], verdict["traces"]
    # In flight at a kill; or, a job that had caught up when killed, the first its restart applied;
    # or, every kill after it had applied all it was given, the last committed (traces.choose).
    whys = ("an event in flight", "nothing was in flight", "an event, through the whole loop (every kill")
    assert verdict["traces"][0]["why"].startswith(whys), verdict
    assert "dead-lettered" in verdict["traces"][1]["why"], verdict["traces"]
    assert out.count("$ outbox trace ") == 2, out
    assert "dead-lettered it" in out and " published as " in out, out
    assert chart.stat().st_size > 10_000, "the chart must be drawn"
    assert not work.exists(), "the demo must delete its scratch directory"
    assert not [pid for pid in _pids() if cmdline_contains(pid, str(work))], "a process outlived the demo"


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
