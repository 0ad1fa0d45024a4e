"""pyspark's daemon for the tests' Spark apps: the modules a worker imports, imported once before it forks.

pyspark's daemon forks a Python worker per concurrent task, and each worker then imports what
its task needs. A sink job's four workers (two tasks that each read Kafka and stage rows) spent
about a CPU-second each on that, most of it on pandas, which pyarrow imports the first time it
builds an array from Python values. Imported once in the daemon, a worker costs about 0.4.

pyspark imports nothing before it forks because pandas and pyarrow start threads when imported,
and a fork copies only the thread that calls it. Here they start none: OpenBLAS (numpy's) gets one
thread, Arrow's jemalloc no background thread, and the daemon refuses to serve if any other thread
is running when it would fork. Set by `tests/spark_conf.py` (`spark.python.daemon.module`); the
demo, the benches and users keep pyspark's own daemon.
"""

from __future__ import annotations

import importlib
import os
import sys

__all__ = ["PRELOADED", "preload"]

# What the sink's and kafka_rc's tasks import, and pyspark's worker with them.
PRELOADED = (
    "pandas",
    "pyarrow.pandas_compat",
    "pyspark.worker",
    "pyspark.sql.worker.plan_data_source_read",
    "sinks.kafka_source.reader",
    "sinks.postgres.stage",
)


def preload() -> None:
    """Import PRELOADED, starting no thread; exit with one line naming any thread that started."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    for module in PRELOADED:
        importlib.import_module(module)
    if len(threads := _threads()) > 1:
        sys.exit(f"outbox_dev.spark_daemon: threads {threads} run after the imports; a fork copies one")


def _threads() -> list[str]:
    """The names of this process's threads (Linux; elsewhere, none are known)."""
    tasks = "/proc/self/task"
    names = []
    for task in os.listdir(tasks) if os.path.isdir(tasks) else ():
        with open(f"{tasks}/{task}/comm") as comm:
            names.append(comm.read().strip())
    return sorted(names)


if __name__ == "__main__":
    # Only the workers' daemon: the daemons of pyspark's planning steps fork once each.
    if sys.argv[1:2] in ([], ["pyspark.worker"]):
        preload()
    from pyspark.daemon import manager

    manager()
