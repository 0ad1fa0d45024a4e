"""Streaming queries start on a driver whose cores are busy, classic and Spark Connect alike.

Spark gives each Python process it starts for a query (kafka_rc's source runner, a Connect
server's foreachBatch process) 10 s to connect back. With each core shared by three spinning
processes, what pyspark's modules import before they connect takes 2.2 s for the source runner and
7.4 s for the foreachBatch process, and beside the server's JVM more than 10 s
(bench/connect_back.py); started by `outbox-spark-python`, they connect back first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Job, busy_cores
from tests.sink_support import check_exactly_once, produce_orders

SINK_JOB = "tests/jobs/sink_job.py"
STARTED_AGAIN = "starting the query again"


@pytest.mark.parametrize("mode", ["classic", "connect"])
def test_the_sink_over_kafka_rc_starts_at_once_on_busy_cores(  # type: ignore[no-untyped-def]
    request: pytest.FixtureRequest, mode: str, bootstrap, topic, db, pg, tmp_path: Path
) -> None:
    """Started while every core is busy, the query starts on its first try (the sink would start
    a Connect query again, and say so) and applies every committed event once."""
    env = {"SPARK_REMOTE": request.getfixturevalue("connect_server").url} if mode == "connect" else {}
    expected = produce_orders(bootstrap, topic, 200)
    argv = [SINK_JOB, bootstrap, topic, db.raw, "orders", str(tmp_path / "checkpoint"), str(tmp_path / "w")]
    with busy_cores(tmp_path / "load.log"):
        job = Job([*argv, "100", "start", "available-now"], tmp_path / "job.log", env)
        assert job.wait(900) == 0, job.output()[-4000:]
    assert STARTED_AGAIN not in job.output(), job.output()[-4000:]
    check_exactly_once(pg, bootstrap, topic, expected)
