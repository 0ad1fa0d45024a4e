"""A Python for Spark to start its workers with, which connects back before it imports anything.

Spark starts a Python process for a streaming query's parts (a Python data source's runner, such
as kafka_rc's in classic mode; a foreachBatch function's process on a Spark Connect server) and
gives it 10 s, a constant in Spark (`PythonWorkerFactory`), to connect back. pyspark connects only
after the module's imports (pyspark, pyarrow, pandas, a Connect client): 0.7 to 2.4 s on an idle
core, past 10 s on a busy one, and the query does not start. Started as
`outbox-spark-python -m MODULE`, this connects back and authenticates with the standard library
alone, then runs MODULE, whose call of `pyspark.worker_util.get_sock_file_to_executor` is given
that connection. Any other start (pyspark's daemon, a worker that connects by itself, a plain
`python` call) becomes this Python's own start with the same arguments.

Set it as the Python of Spark's workers: `spark.pyspark.python` (or `PYSPARK_PYTHON`) for a
classic job, `PYSPARK_PYTHON` in a Spark Connect server's environment.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import socket
import struct
import sys
import sysconfig
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["main", "worker_python"]

_CONNECTS_BY = "get_sock_file_to_executor("  # pyspark.worker_util's, in the modules that use it


def worker_python() -> str:
    """The path of `outbox-spark-python` beside this Python, or this Python where it is not
    installed (the sources run in place)."""
    command = Path(sysconfig.get_path("scripts"), "outbox-spark-python")
    return str(command) if os.access(command, os.X_OK) else sys.executable


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run `-m MODULE ARGS` connected back to Spark first where MODULE lets it; else exec Python."""
    args = list(sys.argv[1:] if argv is None else argv)
    module = args[1] if len(args) >= 2 and args[0] == "-m" else None
    if module is not None and _where(os.environ) is not None and _connects_by_pyspark(module):
        sock = _connect_back(os.environ)
        _hand_over(sock)
        sys.argv = [module, *args[2:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        sys.exit(0)
    os.execv(sys.executable, [sys.executable, *args])


def _where(env: Mapping[str, str]) -> str | int | None:
    """Where the JVM waits for this process: a Unix socket's path, a loopback port, or nowhere."""
    if path := env.get("PYTHON_WORKER_FACTORY_SOCK_PATH"):
        return path
    port = env.get("PYTHON_WORKER_FACTORY_PORT", "")
    return int(port) if port.isdigit() else None


def _connects_by_pyspark(module: str) -> bool:
    """Whether `module` connects back through pyspark.worker_util, read from its source where
    Python would find it first on the path (pyspark.zip, where Spark puts that first). Not
    imported, nor its packages: importing is what would wait."""
    relative = module.replace(".", "/") + ".py"
    for entry in sys.path:
        try:
            if os.path.isdir(entry):
                if not os.path.isfile(path := os.path.join(entry or ".", relative)):
                    continue
                with open(path, encoding="utf-8") as file:
                    source = file.read()
            elif zipfile.is_zipfile(entry):
                with zipfile.ZipFile(entry) as archive:
                    if relative not in archive.NameToInfo:
                        continue
                    source = archive.read(relative).decode()
            else:
                continue
        except (OSError, UnicodeDecodeError, zipfile.BadZipFile):
            return False
        return _CONNECTS_BY in source
    return False


def _connect_back(env: Mapping[str, str]) -> socket.socket:
    """Connect to the JVM and authenticate as pyspark's `local_connect_and_auth` does, then send
    this process's id as `get_sock_file_to_executor` does."""
    where = _where(env)
    timeout = int(env.get("SPARK_AUTH_SOCKET_TIMEOUT", "15"))
    secret = env.get("PYTHON_WORKER_FACTORY_SECRET")
    if isinstance(where, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(where)
    else:
        host = "::1" if env.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        sock = socket.create_connection((host, where), timeout=timeout)
        if secret is not None:
            sock.sendall(struct.pack("!i", len(secret.encode())) + secret.encode())
            if _receive_text(sock) != "ok":
                sock.close()
                sys.exit("outbox-spark-python: Spark refused this worker's secret")
    sock.sendall(struct.pack("!i", os.getpid()))
    return sock


def _receive_text(sock: socket.socket) -> str:
    (length,) = struct.unpack("!i", _receive(sock, 4))
    return _receive(sock, length).decode()


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        if not (chunk := sock.recv(n - len(data))):
            raise ConnectionError("Spark closed the connection while this worker authenticated")
        data += chunk
    return data


def _hand_over(sock: socket.socket) -> None:
    """Give the module the connection in place of the one pyspark would make."""
    import pyspark.worker_util as worker_util

    own = worker_util.get_sock_file_to_executor
    buffer = int(os.environ.get("SPARK_BUFFER_SIZE", "65536"))
    handed = False

    @contextlib.contextmanager
    def connected(timeout: int | None = -1) -> Iterator[Any]:
        nonlocal handed
        if handed:  # a second connection: pyspark's own
            with own(timeout) as again:
                yield again
            return
        handed = True
        if timeout is None or timeout > 0:
            sock.settimeout(timeout)
        sock_file = sock.makefile("rwb", buffer)
        try:
            yield sock_file
        finally:
            sock_file.close()

    worker_util.get_sock_file_to_executor = connected


if __name__ == "__main__":
    main()
