"""The tests' pyspark daemon imports its workers' modules before it forks, and starts no thread doing it."""

from __future__ import annotations

import subprocess
import sys

PRELOAD = "from outbox_dev.spark_daemon import preload, _threads; preload(); print(len(_threads()))"


def run(code: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_the_preload_leaves_one_thread_to_fork() -> None:
    done = run(PRELOAD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_a_thread_running_at_the_fork_stops_the_daemon_with_one_line() -> None:
    # A thread that waits on an event never set: alive at the fork however slow the imports.
    started = "import threading; threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    done = run(started + PRELOAD)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("outbox_dev.spark_daemon: threads [") and line.endswith("a fork copies one"), line
