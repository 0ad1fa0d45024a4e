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


# Who burns the CPU, by command line: the first needle found names the process's share.
# (Spark's command line names the JDBC driver's jar, hence Spark before PostgreSQL.)
COMPONENTS = (
    ("python workers", ("pyspark.daemon", "pyspark.worker")),
    ("bench reader", ("multiprocessing.spawn",)),  # bench/throughput.py's reader, a process of its own
    ("spark JVM", ("org.apache.spark",)),
    ("kafka broker", ("kafka.Kafka",)),
    ("relay", ("outbox\x00relay",)),  # `python -m outbox relay` (arguments are NUL-separated)
    ("kafka connect", ("org.apache.kafka.connect",)),  # Debezium's worker
    ("postgres", ("postgres",)),
)
DRIVER = "this python"  # the benchmark's own process: Spark's driver side, psycopg alone
# Its pid, inherited by the processes it spawns, so that a mark taken in one names it too.
_DRIVER_PID = int(os.environ.setdefault("OUTBOX_BENCH_PID", str(os.getpid())))
Snapshot = dict[int, tuple[str, float]]


def process_seconds() -> Snapshot:
    """Per live process: its component and the CPU seconds it and its reaped children have used.

    A PostgreSQL backend or a Python worker that exits is reaped by the
    postmaster or the worker daemon, whose children's times then include it;
    one caught exiting (no command line left) counts for its parent's component.
    A child that exits during a scan, after its parent was read, would be in
    neither: so the scan is repeated until two in a row see the same processes,
    and the second is kept (one that exited before it is in its parent's times).
    """
    scan = _scan()
    for _ in range(5):
        again = _scan()
        if again.keys() == scan.keys():
            return again
        scan = again
    return scan


def _scan() -> Snapshot:
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[int, tuple[int, str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmd:
                cmdline = cmd.read().decode(errors="replace")
        except OSError:
            continue
        ticks = sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
        seen[int(entry.name)] = (int(fields[1]), cmdline, ticks / tick)

    def component(pid: int) -> str:
        parent, cmdline, _ = seen.get(pid, (0, "", 0.0))
        if pid == _DRIVER_PID:
            return DRIVER
        if not cmdline and parent in seen:
            return component(parent)
        return next((c for c, needles in COMPONENTS if any(n in cmdline for n in needles)), "other")

    return {pid: (component(pid), seconds) for pid, (_, _, seconds) in seen.items()}


def by_component(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per component between two `process_seconds` snapshots."""
    spent: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        start = before.get(pid, (name, 0.0))[1]
        spent[name] = spent.get(name, 0.0) + max(0.0, seconds - start)
    return spent


@dataclass(frozen=True)
class Usage:
    wall_s: float
    cpu_s: float | None
    components: dict[str, float]  # CPU seconds per component (COMPONENTS, DRIVER, "other")

    def cores_busy(self) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / self.wall_s

    def cpu_us_per(self, records: int) -> float | None:
        return None if self.cpu_s is None else self.cpu_s / records * 1e6

    def components_us_per(self, records: int) -> dict[str, float]:
        return {name: round(seconds / records * 1e6, 1) for name, seconds in self.components.items()}


@dataclass(frozen=True)
class Mark:
    """The machine's CPU counters at one moment: a step's usage is what two marks differ by."""

    processes: Snapshot
    busy: float | None
    wall: float

    @classmethod
    def now(cls) -> Mark:
        return cls(process_seconds(), busy_seconds(), time.perf_counter())

    def since(self, start: Mark) -> Usage:
        cpu = None if self.busy is None or start.busy is None else self.busy - start.busy
        return Usage(self.wall - start.wall, cpu, by_component(start.processes, self.processes))


def measured(step: Callable[[], T]) -> tuple[T, Usage]:
    start = Mark.now()
    result = step()
    return result, Mark.now().since(start)
