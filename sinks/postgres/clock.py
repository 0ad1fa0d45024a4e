"""Where a task's time goes, stage by stage: what bench/sink.py breaks a batch's cost into.

A task's stages, in order: waiting for its input (the source's fetch and
decode, and Spark's conversion to Arrow, all upstream of the task's code),
encoding rows as CSV, the COPY, locking its ledger rows, the apply statement
(rows, outbox events, dead letters and the ledger's move, in one), and the
commit. A transaction that starts over adds to the same stages.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

STAGES = ("input", "encode", "copy", "lock", "apply", "commit")


class Clock:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
