"""`outbox relay` for fault tests, held at a named point of a batch (outbox.relay.pause).

Usage: relay_job.py PAUSE_AT RESUME_FILE [outbox relay flags...]
PAUSE_AT is none or one of outbox.relay.pause.POINTS. At the first batch that
reaches it the job prints "paused at X" and waits until RESUME_FILE exists
(a test kills it there, or lets it go on). SIGUSR1 prints every thread's stack to the log: what a
relay that has stopped making progress is waiting for.
"""

import faulthandler
import signal
import sys
import time
from pathlib import Path

from outbox.cli import main
from outbox.relay.pause import POINTS

pause_at, resume = sys.argv[1], Path(sys.argv[2])
if pause_at not in (*POINTS, "none"):
    sys.exit(f"relay_job: no pause point {pause_at!r}; one of none, {', '.join(POINTS)}")
paused = False
faulthandler.register(signal.SIGUSR1, all_threads=True)


def pause(point: str) -> None:
    global paused
    if point != pause_at or paused:
        return
    paused = True
    print(f"paused at {point}", flush=True)
    while not resume.exists():
        time.sleep(0.05)


sys.exit(main(["relay", *sys.argv[3:]], pause=None if pause_at == "none" else pause))
