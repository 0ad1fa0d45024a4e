"""outbox-spark-python: connects back to Spark the way pyspark does, before the module's imports."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from sinks import spark_python
from sinks.spark_python import worker_python

# A worker module as pyspark's are: it connects back through pyspark.worker_util, here only after
# its imports end, which wait until the "JVM" has seen the connection (so a late connect hangs).
WORKER = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["CONNECTED_MARK"]):
    assert time.monotonic() < deadline, "never connected back before the imports"
    time.sleep(0.05)
from pyspark.worker_util import get_sock_file_to_executor

if __name__ == "__main__":
    with get_sock_file_to_executor(timeout=None) as sock_file:
        sock_file.write(sock_file.read(5)[::-1])
        sock_file.flush()
"""


def _receive(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the worker closed the connection"
        data += chunk
    return data


def test_a_worker_connects_back_and_authenticates_before_its_module_is_imported(tmp_path: Path) -> None:
    (tmp_path / "late_worker.py").write_text(textwrap.dedent(WORKER))
    mark = tmp_path / "connected"
    secret = "s3cret-ß-⚡"
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
            "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1]),
            "PYTHON_WORKER_FACTORY_SECRET": secret,
            "CONNECTED_MARK": str(mark),
        }
        worker = subprocess.Popen([worker_python(), "-m", "late_worker"], env=env)
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(60)
                (length,) = struct.unpack("!i", _receive(conn, 4))
                assert _receive(conn, length).decode() == secret
                conn.sendall(struct.pack("!i", 2) + b"ok")
                assert struct.unpack("!i", _receive(conn, 4)) == (worker.pid,)
                mark.touch()
                conn.sendall(b"hello")
                assert _receive(conn, 5) == b"olleh"
            assert worker.wait(60) == 0
        finally:
            worker.kill()
            worker.wait()


def test_a_wrong_secret_ends_the_worker_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "late_worker.py").write_text(textwrap.dedent(WORKER))
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        env = {
            **os.environ,
            "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1]),
            "PYTHON_WORKER_FACTORY_SECRET": "the-secret",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
        }
        worker = subprocess.Popen(
            [worker_python(), "-m", "late_worker"], env=env, stderr=subprocess.PIPE, text=True
        )
        conn, _ = server.accept()
        with conn:
            (length,) = struct.unpack("!i", _receive(conn, 4))
            _receive(conn, length)
            conn.sendall(struct.pack("!i", 2) + b"no")
            _, err = worker.communicate(timeout=60)
    assert worker.returncode == 1
    assert err.strip().splitlines() == ["outbox-spark-python: Spark refused this worker's secret"]
    assert "the-secret" not in err


def test_any_other_start_is_pythons_own() -> None:
    done = subprocess.run(
        [worker_python(), "-c", "import sys; print(sys.argv, sys.executable)"],
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON_WORKER_FACTORY")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    argv, executable = done.stdout.split()
    assert argv == "['-c']" and Path(executable).resolve() == Path(sys.executable).resolve()


@pytest.mark.parametrize(
    ("env", "where"),
    [
        ({"PYTHON_WORKER_FACTORY_PORT": "4242"}, 4242),
        ({"PYTHON_WORKER_FACTORY_SOCK_PATH": "/run/w", "PYTHON_WORKER_FACTORY_PORT": "1"}, "/run/w"),
        ({"PYTHON_WORKER_FACTORY_PORT": "-1"}, None),
        ({}, None),
    ],
)
def test_where_the_jvm_waits(env: dict[str, str], where: object) -> None:
    assert spark_python._where(env) == where


def test_the_modules_that_connect_by_pyspark_are_found_in_a_zip_or_a_folder_unimported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped/runner.py", "raise SystemExit('imported')\nget_sock_file_to_executor()\n")
        z.writestr("zipped/daemon.py", "manager()\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "worker.py").write_text("with get_sock_file_to_executor(timeout=None): pass\n")
    monkeypatch.setattr(sys, "path", [str(archive), str(tmp_path), "/nonexistent"])
    assert spark_python._connects_by_pyspark("zipped.runner")
    assert spark_python._connects_by_pyspark("folder.worker")
    assert not spark_python._connects_by_pyspark("zipped.daemon")
    assert not spark_python._connects_by_pyspark("nowhere.at_all")
    assert "zipped" not in sys.modules and "folder" not in sys.modules
