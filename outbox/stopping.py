"""A stop request (SIGTERM, SIGINT) that may arrive before the program is ready for it.

The `outbox` command catches both signals first thing, before its heavy
imports, so a daemon told to stop while it is still starting exits cleanly
(0) instead of dying of the signal. Commands that are not daemons give the
signals back their usual meaning once they start.

A daemon may bound its stop (`bound_stop`): once asked, it is gone within
that many seconds, its work in flight finished or not; and a second signal
ends it at once. Both leave the relay's Kafka transaction open, which the
next producer of its transactional.id aborts (fencing): nothing is lost or
published twice.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

STOP = threading.Event()
_received: list[int] = []
_bound: list[float] = []  # the daemon's stop bound, once it set one
PASSED_BOUND = 3  # the exit status of a stop that outlasted its bound


def catch_stop_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _record)


def release_stop_signals() -> None:
    """Back to the usual handling; a stop already requested ends the program now, as the signal would have."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _received:
        sys.exit(128 + _received[0])


def bound_stop(seconds: float) -> None:
    """Once a stop is asked, exit within `seconds` whatever is still in flight."""
    _bound[:] = [seconds]
    if STOP.is_set():
        _start_bound()


def _record(sig: int, _frame: object) -> None:
    if _received:  # asked again: at once, as the caller means it
        os.write(2, f"outbox: {signal.Signals(sig).name} again: exiting at once\n".encode())
        os._exit(128 + sig)
    _received.append(sig)
    STOP.set()
    if _bound:
        _start_bound(signal.Signals(sig).name)


def _start_bound(name: str = "a stop") -> None:
    """The bound's timer, and its line, from threads of their own: a signal handler logs nothing."""
    timer = threading.Timer(_bound[0], _passed, (_bound[0],))
    timer.daemon = True
    timer.start()
    said = f"{name}: stopping once the work in flight ends, within %gs ({name} again: at once)"
    threading.Thread(target=logging.getLogger("outbox").warning, args=(said, _bound[0]), daemon=True).start()


def _passed(seconds: float) -> None:
    logging.getLogger("outbox").error(
        "the work in flight did not end within the stop bound of %gs: exiting with it unfinished"
        " (a Kafka transaction left open is aborted by the next relay's producer)",
        seconds,
    )
    logging.shutdown()
    os._exit(PASSED_BOUND)
