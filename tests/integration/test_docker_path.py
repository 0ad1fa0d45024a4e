"""The suite's Docker path: real Apache Kafka and PostgreSQL in containers.

Skipped, with the reason shown in the summary, where no Docker engine runs.
"""

from pathlib import Path

import pytest

from tests import containers
from tests.helpers import Job


@pytest.mark.docker
def test_demo_against_real_apache_kafka_and_postgres(tmp_path: Path) -> None:
    reason = containers.docker_unavailable_reason()
    if reason:
        pytest.skip(f"Docker path not run: {reason}")
    with containers.services() as env:
        job = Job(
            ["-m", "demos.smoke", "--events", "200", "--dir", str(tmp_path / "demo")],
            tmp_path / "demo.log",
            env,
        )
        assert job.wait(600) == 0, job.output()
        assert "OK: every committed event applied once" in job.output()
