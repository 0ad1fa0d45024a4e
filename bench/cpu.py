"""Machine-wide CPU use while a benchmark step runs (Linux /proc/stat).

On a small machine where the broker, PostgreSQL and Spark share the cores, a
ratio of throughputs alone cannot say whether a reader is slow or the machine
is full: the CPU seconds each step burns per record can.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


def busy_seconds() -> float | None:
    """CPU seconds all cores have spent not idle since boot; None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Usage:
    wall_s: float
    cpu_s: float | None

    def cores_busy(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / self.wall_s

    def cpu_us_per(self, records: int) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / records * 1e6


def measured(step: Callable[[], T]) -> tuple[T, Usage]:
    cpu0, wall0 = busy_seconds(), time.perf_counter()
    result = step()
    cpu1, wall = busy_seconds(), time.perf_counter() - wall0
    return result, Usage(wall, None if cpu0 is None or cpu1 is None else cpu1 - cpu0)
