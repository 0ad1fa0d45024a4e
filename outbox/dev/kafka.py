"""A throwaway Apache Kafka broker: one KRaft node (broker and controller) from Kafka's own jars.

The jars come from Maven once (`outbox/jvm/poms/kafka.xml`); the broker runs
as a plain `kafka.Kafka` process with a generated `server.properties` in its
data directory, so a restart on the same directory keeps its ports, its
cluster id and every committed record.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from core.errors import ConfigError, ServiceUnavailable
from core.probe import check_kafka
from outbox.dev.process import free_port, spawn, stop, wait_until
from outbox.dev.service import Service
from outbox.jvm import log4j2, maven
from outbox.jvm.java import find_java

INSTEAD = "or set KAFKA_BOOTSTRAP_SERVERS to use your own cluster"
WHAT = "Apache Kafka's jars"
HEAP = "512m"
# A single node: internal topics have one replica and one partition (quick to create).
SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Abandoned transactions are aborted within a second of their timeout, not ten.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "4",
}


def server_properties(data_dir: Path, port: int, controller_port: int) -> dict[str, str]:
    """The broker's settings: PLAINTEXT on port, the controller on controller_port, logs in data_dir."""
    return {
        **SETTINGS,
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(data_dir / "logs"),
    }


def render(properties: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in properties.items())


def read_properties(path: Path) -> dict[str, str]:
    lines = [line.split("=", 1) for line in path.read_text().splitlines() if "=" in line]
    return {key.strip(): value.strip() for key, value in lines}


def cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (as Kafka's Uuid).

    Like Kafka's own Uuid.randomUuid, never one that starts with "-": a command
    line would read it as an option.
    """
    while (text := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return text


def start(data_dir: Path, port: int, *, die_with_parent: bool) -> Service:
    """Start the broker on 127.0.0.1:port; wait until it answers metadata requests.

    A data directory the broker already ran in is started again as it was
    (same controller port, same log): that is a broker restart.
    """
    java = find_java(needed_by="The embedded Kafka broker")
    classpath = maven.classpath(maven.jars("kafka", what=WHAT, instead=INSTEAD))
    data_dir.mkdir(parents=True, exist_ok=True)
    config, log = data_dir / "server.properties", data_dir / "kafka.log"
    log4j, scratch = data_dir / "log4j2.properties", data_dir / "tmp"
    scratch.mkdir(exist_ok=True)
    known = read_properties(config) if config.exists() else {}
    if not known.get("listeners", "").startswith(f"PLAINTEXT://127.0.0.1:{port},"):
        config.write_text(render(server_properties(data_dir, port, free_port())))
        log4j.write_text(log4j2.file_config(data_dir / "server.log", {"kafka.request.logger": "warn"}))
    jvm = [
        str(java.path),
        f"-Xmx{HEAP}",
        f"-Xms{HEAP}",
        "-XX:-UsePerfData",
        "-Djava.awt.headless=true",
        # Compression codecs unpack native libraries into the temp dir: keep it ours.
        f"-Djava.io.tmpdir={scratch}",
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath,
    ]
    if not (data_dir / "logs" / "meta.properties").exists():  # a restart keeps its storage
        fmt = [*jvm, "kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(config)]
        result = subprocess.run(fmt, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            lines = (result.stderr + result.stdout).strip().splitlines() or ["no output"]
            first = next((line for line in lines if "Exception" in line or "rror" in line), lines[0])
            raise ConfigError(f"formatting Kafka's storage in {data_dir} failed: {first.strip()}")
    argv = [*jvm, "kafka.Kafka", str(config)]
    proc = spawn(argv, log, die_with_parent=signal.SIGKILL if die_with_parent else None)
    wait_until(lambda: _answers(port), proc, what="Kafka broker", log=data_dir / "server.log", timeout=120)
    bootstrap = f"127.0.0.1:{port}"
    return Service("kafka", proc.pid, port, data_dir, log, {"KAFKA_BOOTSTRAP_SERVERS": bootstrap})


def _answers(port: int) -> bool:
    try:
        check_kafka(f"127.0.0.1:{port}", timeout=1)
    except ServiceUnavailable:
        return False
    return True


class Broker:
    """A broker of one run's own (a test's, the demo's), so it can be restarted or killed -9."""

    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.service: Service = start(root, port or free_port(), die_with_parent=True)

    @property
    def bootstrap(self) -> str:
        return self.service.env["KAFKA_BOOTSTRAP_SERVERS"]

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: a controlled shutdown; SIGKILL: a crash) and start it on the same log."""
        stop(self.service.pid, sig, timeout=60)
        self.service = start(self.root, self.service.port, die_with_parent=True)

    def stop(self) -> None:
        stop(self.service.pid, signal.SIGKILL)
