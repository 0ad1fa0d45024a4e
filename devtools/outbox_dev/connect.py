"""A Spark Connect server on loopback, from the installed pyspark's own jars.

Clients reach it as `sc://127.0.0.1:PORT` (`SparkSession.builder.remote`, or
SPARK_REMOTE). Everything a client's job runs beside the server (its
foreachBatch function, its Python data sources, its tasks' Python workers) runs
with the server's Python and environment: this Python, the one the project is
installed in. The server dies with the process that started it, and writes
only inside the given folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from outbox_dev.local_spark import prepare_environment, session_settings
from outbox_dev.process import choose_port, port_in_use, spawn, stop, wait_until
from outbox_dev.spark import spark_home

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# A client's own settings, which must not make the server a client too.
_CLIENT_ENV = (
    "SPARK_REMOTE",
    "SPARK_LOCAL_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_CONNECT_AUTHENTICATE_TOKEN",
)


class ConnectServer:
    """One Spark Connect server: `master` its cluster (`local[2]`, or a standalone master's URL).

    env: the server's own variables (its batch functions' and tasks' too); conf:
    Spark settings for it; port: a free one unless given. `kill9` and `start` again keep the port, so clients
    can reconnect to the same URL.
    """

    def __init__(
        self,
        root: Path,
        *,
        master: str = "local[2]",
        jars: Sequence[Path] = (),
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = choose_port(port, "--port")
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = self.root / "connect-server.log"
        settings = session_settings(self.root, app_name="outbox-connect", master=master, conf=conf, jars=jars)
        settings |= {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
        }
        self._argv = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        for key, value in settings.items():
            self._argv += ["--conf", f"{key}={value}"]
        environ = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
        self._env = dict(prepare_environment({**environ, "SPARK_HOME": str(spark_home()), **(env or {})}))
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, timeout: float = 120.0) -> None:
        """Start the server (again) and return once it takes connections."""
        self.process = spawn(self._argv, self.log, die_with_parent=signal.SIGKILL, env=self._env)
        try:
            wait_until(
                lambda: port_in_use(self.port),
                self.process,
                what="Spark Connect server",
                log=self.log,
                timeout=timeout,
            )
        except BaseException:
            self.stop()
            raise

    def kill9(self) -> None:
        """SIGKILL the server's JVM, as a crash would: its Python workers die with it."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process.pid, signal.SIGTERM, timeout=30)
            self.process = None

    def __enter__(self) -> ConnectServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
