"""Starting over on errors that are about the moment, not the rows: one rule for tasks and batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from outbox._core.errors import ServiceUnavailable
from outbox._core.postgres import first_line

log = logging.getLogger("sinks.postgres")

T = TypeVar("T")

# Connection lost or refused, the server shutting down, deadlocks and serialization failures
# (psycopg's OperationalError); a server that cannot be reached or stopped answering.
MOMENTARY = (psycopg.OperationalError, ServiceUnavailable)


def with_retries(attempt: Callable[[], T], budget: float, who: str) -> tuple[T, int]:
    """Run `attempt` again on MOMENTARY errors for up to `budget` seconds; its result and how many
    times it started over. The ledger makes a repeat harmless. The first error is said in one line,
    and the end of the trouble in another: no line a retry."""
    began = time.monotonic()
    pause, retries = 0.1, 0
    while True:
        try:
            done = attempt()
        except MOMENTARY as exc:
            if time.monotonic() + pause > began + budget:
                raise
            if not retries:
                log.warning("%s: %s; starting over for up to %.0fs", who, first_line(exc).rstrip("."), budget)
        else:
            if retries:
                log.warning("%s: applied after %d retries, %.1fs", who, retries, time.monotonic() - began)
            return done, retries
        time.sleep(pause)
        pause, retries = min(pause * 2, 5.0), retries + 1
