"""`outbox relay` for fault tests, held at a named point of a batch (outbox.relay.pause).

Usage: relay_job.py PAUSE_AT RESUME_FILE [outbox relay flags...]
PAUSE_AT is none or one of outbox.relay.pause.POINTS, optionally with #N. At the first batch that
reaches it (the Nth, with #N) the job prints "paused at X" and waits until RESUME_FILE exists
(a test kills it there, or lets it go on). PAUSE_AT late-commit: a commit's answer comes late.
When the file FREEZE_FILE exists, the next commit about to be sent takes it away and freezes the
broker of pid FREEZE_PID (SIGSTOP) for FREEZE_S seconds, longer than the relay's request timeout:
the EndTxn request is sent, and its answer is read only after the relay's call timed out.
SIGUSR1 prints every thread's stack to the log: what a relay that has stopped making progress is
waiting for.
"""

import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path

from outbox.cli import main
from outbox.relay.pause import BEFORE_COMMIT, POINTS

LATE_COMMIT = "late-commit"
pause_at, resume = sys.argv[1], Path(sys.argv[2])
point_at, _, nth = pause_at.partition("#")
if point_at not in (*POINTS, LATE_COMMIT, "none") or not (nth or "1").isdigit():
    sys.exit(f"relay_job: no pause point {pause_at!r}; one of none, {LATE_COMMIT}, {', '.join(POINTS)}")
reached = 0  # times the batch reached point_at
faulthandler.register(signal.SIGUSR1, all_threads=True)


def late_commit(point: str) -> None:
    """Freeze the broker just before the commit is sent, where the test asked for it; a timer thaws
    it (and so does the test, if this process is killed or frozen first)."""
    if point != BEFORE_COMMIT:
        return
    try:
        Path(os.environ["FREEZE_FILE"]).unlink()  # the test's ask, taken by one relay only
    except FileNotFoundError:
        return
    broker, seconds = int(os.environ["FREEZE_PID"]), float(os.environ["FREEZE_S"])
    os.kill(broker, signal.SIGSTOP)
    threading.Timer(seconds, os.kill, (broker, signal.SIGCONT)).start()
    print(f"late commit: the broker frozen for {seconds:.0f}s as the commit is sent", flush=True)


def pause(point: str) -> None:
    global reached
    if point != point_at:
        return
    reached += 1
    if reached != int(nth or "1"):
        return
    print(f"paused at {pause_at}", flush=True)
    while not resume.exists():
        time.sleep(0.05)


hook = {"none": None, LATE_COMMIT: late_commit}.get(pause_at, pause)
sys.exit(main(["relay", *sys.argv[3:]], pause=hook))
