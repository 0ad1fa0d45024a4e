"""A Spark standalone cluster on loopback, from the installed pyspark: a master and its workers.

Executors on such a cluster are JVMs of their own, started by the workers,
with their own Python workers and nothing of the driver's memory: what a job
meets when it outgrows `local[N]`. The processes die with the one that
started them, and everything they write stays in the given folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path

from outbox.core.java import find_java
from outbox_dev.jvm import JVM_FLAGS
from outbox_dev.process import (
    cmdline_contains,
    descendants,
    free_port,
    port_in_use,
    spawn,
    stop,
    wait_until,
)
from sinks.spark_python import worker_python


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """`workers` workers of `cores` cores each, registered with one master.

    worker_env: each worker's own environment variables, which its executors
    and their Python workers inherit (libpq's PGPORT, say, for each worker to
    reach PostgreSQL by a way of its own).
    """

    def __init__(
        self,
        root: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        worker_env: Sequence[Mapping[str, str]] = (),
    ) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        java = find_java(needed_by="A Spark standalone cluster")
        self.env = {
            **os.environ,
            "JAVA_HOME": str(java.path.resolve().parent.parent),
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_LOCAL_DIRS": str(self.root / "local"),
            "PYSPARK_PYTHON": worker_python(),
            # The master and the worker; not the executors, which do the work C2 pays for.
            "SPARK_DAEMON_JAVA_OPTS": f"{' '.join(JVM_FLAGS)} -Djava.io.tmpdir={self.root / 'local'}",
            # spark-class first runs a launcher JVM of its own: it must not leave /tmp/hsperfdata_* either.
            "SPARK_LAUNCHER_OPTS": " ".join(JVM_FLAGS),
        }
        (self.root / "local").mkdir(exist_ok=True)
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.pids: list[int] = []
        try:
            master = self._start("master", "org.apache.spark.deploy.master.Master", "--port", str(self.port))
            wait_until(lambda: port_in_use(self.port), master, what="Spark master", log=self._log("master"))
            for n in range(workers):
                name = f"worker-{n}"
                work = self.root / name
                work.mkdir(exist_ok=True)
                args = ["--cores", str(cores), "--memory", memory, "--work-dir", str(work), self.url]
                own = worker_env[n] if n < len(worker_env) else {}
                worker = self._start(name, "org.apache.spark.deploy.worker.Worker", *args, env=own)
                log = self._log(name)
                wait_until(
                    partial(_registered, log),
                    worker,
                    what=f"Spark {name}",
                    log=log,
                    timeout=120,
                )
        except BaseException:
            self.stop()
            raise

    def _log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def _start(
        self, name: str, main: str, *args: str, env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        argv = [str(spark_home() / "bin" / "spark-class"), main, "--host", "127.0.0.1", "--webui-port", "0"]
        proc = spawn(
            [*argv, *args], self._log(name), die_with_parent=signal.SIGKILL, env={**self.env, **(env or {})}
        )
        self.pids.append(proc.pid)
        return proc

    def worker_of(self, pid: int) -> int:
        """The number of the worker that runs process `pid` (an executor, or one of its Python workers)."""
        return next(n for n, worker in enumerate(self.pids[1:]) if pid in descendants(worker))

    def executors(self) -> list[int]:
        """Pids of the executor JVMs the workers run now."""
        below = [pid for worker in self.pids for pid in descendants(worker)]
        return [pid for pid in below if cmdline_contains(pid, "CoarseGrainedExecutorBackend")]

    def stop(self) -> None:
        """Workers first (their executors with them), then the master."""
        for pid in reversed(self.pids):
            stop(pid, signal.SIGTERM, timeout=20)
        self.pids.clear()


def _registered(log: Path) -> bool:
    return "Successfully registered with master" in log.read_text()
