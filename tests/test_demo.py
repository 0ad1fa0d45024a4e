"""`make demo`'s program end to end, against this run's services given by env var."""

from pathlib import Path

from outbox.config import DatabaseUrl
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
