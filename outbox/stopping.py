"""A stop request (SIGTERM, SIGINT) that may arrive before the program is ready for it.

The `outbox` command catches both signals first thing, before its heavy
imports, so a daemon told to stop while it is still starting exits cleanly
(0) instead of dying of the signal. Commands that are not daemons give the
signals back their usual meaning once they start.
"""

from __future__ import annotations

import signal
import sys
import threading

STOP = threading.Event()
_received: list[int] = []


def catch_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record)


def release_stop_signals() -> None:
    """Back to the usual handling; a stop already requested ends the program now, as the signal would have."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _received:
        sys.exit(128 + _received[0])


def _record(sig: int, _frame: object) -> None:
    _received.append(sig)
    STOP.set()
