"""Starting over on errors that are about the moment, not the rows: one rule for tasks and batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from outbox.core.errors import ServiceUnavailable
from outbox.core.postgres import first_line

log = logging.getLogger("sinks.postgres")

T = TypeVar("T")

# Connection lost or refused, the server shutting down, deadlocks and serialization failures
# (psycopg's OperationalError); a server that cannot be reached or stopped answering.
MOMENTARY = (psycopg.OperationalError, ServiceUnavailable)


def with_retries(attempt: Callable[[], T], budget: float, who: str) -> tuple[T, int]:
    """Run `attempt` again on MOMENTARY errors for up to `budget` seconds from the first one; its
    result and how many times it started over. The ledger makes a repeat harmless. The first error
    is said in one line, and the end of the trouble in another: no line a retry. (Counted from the
    first attempt's start, a batch whose tasks ran longer than the budget was never retried.)"""
    began: float | None = None
    pause, retries = 0.1, 0
    while True:
        try:
            done = attempt()
        except MOMENTARY as exc:
            if began is None:
                began = time.monotonic()
                log.warning("%s: %s; starting over for up to %.0fs", who, first_line(exc).rstrip("."), budget)
            if time.monotonic() + pause > began + budget:
                raise
        else:
            if began is not None:
                log.warning("%s: applied after %d retries, %.1fs", who, retries, time.monotonic() - began)
            return done, retries
        time.sleep(pause)
        pause, retries = min(pause * 2, 5.0), retries + 1


# Spark Connect's server starts a Python process for a foreachBatch function and gives it 10 s,
# a constant in Spark (PythonWorkerFactory), to connect back; a busy server misses that (unless its
# workers' Python is outbox-spark-python, sinks/spark_python.py). The query did not start then, and
# nothing ran: starting it again is safe, after a pause that doubles, while the load may pass.
WORKER_LATE = "Timed out while waiting for the Python worker to connect back"
START_ATTEMPTS = 5
START_PAUSE = 2.0  # seconds before the second start; doubled before each next one


def worker_was_late(exc: BaseException) -> bool:
    """Spark's error for a batch function's Python process that did not connect back in time."""
    return WORKER_LATE in str(exc)


def start_query(
    start: Callable[[], T], who: str, attempts: int = START_ATTEMPTS, pause: float = START_PAUSE
) -> T:
    """`start()`, again when only the server's Python process was late (`worker_was_late`)."""
    for attempt in range(2, attempts + 1):
        try:
            return start()
        except Exception as exc:
            if not worker_was_late(exc):
                raise
            log.warning(
                "%s: the Spark Connect server's Python process for the batch function did not connect"
                " back within Spark's 10 s (a busy server); starting the query again in %.0fs (%d of %d)",
                who,
                pause,
                attempt,
                attempts,
            )
        time.sleep(pause)
        pause *= 2
    return start()
