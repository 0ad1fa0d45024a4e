"""Run the `outbox` command as a user would: a child process, its output, its exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO


@dataclass
class Result:
    code: int
    out: str
    err: str


def outbox(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")}
    proc = subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd or REPO,
        env={**base, "PYTHONPATH": str(REPO), **(env or {})},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{result.err}"
    assert lines[0].startswith("outbox: error: ")
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
