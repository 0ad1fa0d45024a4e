"""A throwaway Kafka broker: the `noida-db` wheel's Kafka-protocol binary.

It implements idempotent and transactional producers, read_committed and
consumer groups, but never enforces session or transaction timeouts (see
README, "Embedded services").
"""

from __future__ import annotations

import os
import signal
import socket
from importlib.resources import files
from pathlib import Path

from outbox.dev.process import spawn, wait_until
from outbox.dev.service import Service
from outbox.errors import ConfigError, ServiceUnavailable
from outbox.probe import check_kafka


def binary() -> Path:
    try:
        path = Path(str(files("noida_db").joinpath("noida-db")))
    except ModuleNotFoundError:
        raise ConfigError(
            "the embedded Kafka broker is not installed: pip install 'outbox-eos[embedded]',"
            " or set KAFKA_BOOTSTRAP_SERVERS to use your own cluster"
        ) from None
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return path


def start(data_dir: Path, port: int, *, die_with_parent: bool) -> Service:
    """Start the broker on 127.0.0.1:port; wait until it answers metadata requests."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / "kafka.log"
    argv = [
        str(binary()),
        "start",
        "--only",
        "kafka",
        "--host",
        "127.0.0.1",
        "--kafka-port",
        str(port),
        "--data-dir",
        str(data_dir / "data"),
    ]
    proc = spawn(argv, log, die_with_parent=signal.SIGKILL if die_with_parent else None)
    bootstrap = f"127.0.0.1:{port}"
    wait_until(lambda: _answers(port), proc, what="Kafka broker", log=log)
    return Service("kafka", proc.pid, port, data_dir, log, {"KAFKA_BOOTSTRAP_SERVERS": bootstrap})


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
    except OSError:
        return False
    try:
        check_kafka(f"127.0.0.1:{port}", timeout=2)
    except ServiceUnavailable:
        return False
    return True
