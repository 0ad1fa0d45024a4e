"""A throwaway Apache Kafka: one KRaft node (broker and controller), or a cluster of them, from Kafka's jars.

The jars come from Maven once (`outbox/jvm/poms/kafka.xml`); each node runs
as a plain `kafka.Kafka` process with a generated `server.properties` in its
data directory, so a restart on the same directory keeps its ports, its
cluster id and every committed record. A cluster is N combined nodes, all
of them controller voters, with every topic replicated as production has them
(3 replicas, 2 in sync), internal ones and those created without a factor.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from outbox.core.errors import ServiceUnavailable
from outbox.core.java import find_java
from outbox.core.probe import check_kafka
from outbox_dev.errors import error
from outbox_dev.jvm import JVM_FLAGS, cds, log4j2, maven
from outbox_dev.process import free_port, spawn, stop, wait_until
from outbox_dev.service import Service

INSTEAD = "or set KAFKA_BOOTSTRAP_SERVERS to use your own cluster"
WHAT = "Apache Kafka's jars"
HEAP = "512m"
# Internal topics have one partition (quick to create); their replicas follow the cluster's size.
SETTINGS = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": (
        "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,PROXIED:PLAINTEXT,SECURED:SASL_PLAINTEXT"
    ),
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Abandoned transactions are aborted within a second of their timeout, not ten.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "4",
    "background.threads": "2",
    "num.replica.fetchers": "1",
    # The active controller appends a no-op record to the metadata log after 500 ms without one, by
    # default, so that monitoring sees a live quorum. That was half of an idle node's CPU (2.0% of a
    # core, 0.9% with 5 s; measured over a minute), paid by every node of every test for its life.
    "metadata.max.idle.interval.ms": "5000",
}


@dataclass(frozen=True)
class Proxied:
    """A second client listener on `port`, advertised at `advertised`: where a fault proxy listens
    (outbox_dev.toxiproxy) and passes the bytes on to `port`. A client that bootstraps through the
    proxy gets the proxy's addresses in every metadata answer, so it never goes around it."""

    port: int
    advertised: int

    @classmethod
    def new(cls) -> Proxied:
        return cls(free_port(), free_port())


@dataclass(frozen=True)
class Secured:
    """A SASL/PLAIN listener on `port` for `users` (name, password), each allowed only what ACLs grant
    (Kafka's StandardAuthorizer), as a production cluster's clients are. The node itself and the plain
    listener's clients (the tests' own admin and readers) are ANONYMOUS there, a super user."""

    port: int
    users: tuple[tuple[str, str], ...]

    def client(self, user: str) -> dict[str, str]:
        """librdkafka's settings for `user` on this listener."""
        password = dict(self.users)[user]
        return {
            "bootstrap.servers": f"127.0.0.1:{self.port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": password,
        }

    def settings(self) -> dict[str, str]:
        logins = " ".join(f'user_{name}="{password}"' for name, password in self.users)
        return {
            "listener.name.secured.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.secured.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {logins};"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
        }


@dataclass(frozen=True)
class Node:
    """One node of a KRaft quorum: its id, its client port and its controller port (and a proxied one)."""

    id: int
    port: int
    controller_port: int
    proxied: Proxied | None = None
    secured: Secured | None = None


def replicas(nodes: int) -> tuple[int, int]:
    """Replicas and min.insync.replicas for topics on a cluster of `nodes`: (3, 2) where it can."""
    factor = max(1, min(3, nodes))
    return factor, min(2, max(1, factor - 1))


def server_properties(data_dir: Path, node: Node, voters: Sequence[Node]) -> dict[str, str]:
    """A node's settings: PLAINTEXT on its port, the controller on its controller port, logs in data_dir."""
    factor, in_sync = str(replicas(len(voters))[0]), str(replicas(len(voters))[1])
    listeners = f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
    advertised = f"PLAINTEXT://127.0.0.1:{node.port}"
    if node.proxied:
        listeners += f",PROXIED://127.0.0.1:{node.proxied.port}"
        advertised += f",PROXIED://127.0.0.1:{node.proxied.advertised}"
    if node.secured:
        listeners += f",SECURED://127.0.0.1:{node.secured.port}"
        advertised += f",SECURED://127.0.0.1:{node.secured.port}"
    return {
        **SETTINGS,
        **(node.secured.settings() if node.secured else {}),
        "node.id": str(node.id),
        "controller.quorum.voters": ",".join(f"{v.id}@127.0.0.1:{v.controller_port}" for v in voters),
        "listeners": listeners,
        "advertised.listeners": advertised,
        "log.dirs": str(data_dir / "logs"),
        "offsets.topic.replication.factor": factor,
        "transaction.state.log.replication.factor": factor,
        "transaction.state.log.min.isr": in_sync,
        "share.coordinator.state.topic.replication.factor": factor,
        "share.coordinator.state.topic.min.isr": in_sync,
        "min.insync.replicas": in_sync,
        "default.replication.factor": factor,
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


def start(
    data_dir: Path,
    port: int,
    *,
    die_with_parent: bool,
    proxied: Proxied | None = None,
    secured: Secured | None = None,
) -> Service:
    """Start a one-node cluster on 127.0.0.1:port; wait until it answers metadata requests.

    A data directory the broker already ran in is started again as it was
    (same controller port, same log): that is a broker restart.
    """
    config = data_dir / "server.properties"
    known = read_properties(config) if config.exists() else {}
    if not known.get("listeners", "").startswith(f"PLAINTEXT://127.0.0.1:{port},"):
        node = Node(1, port, free_port(), proxied, secured)
        configure(data_dir, node, [node], cluster_id())
    proc = launch(data_dir, die_with_parent=die_with_parent)
    wait_until(lambda: _answers(port), proc, what="Kafka broker", log=data_dir / "server.log", timeout=120)
    return Service(
        "kafka", proc.pid, port, data_dir, log_of(data_dir), {"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    )


def configure(data_dir: Path, node: Node, voters: Sequence[Node], cluster: str) -> None:
    """Write a node's server.properties and format its storage for `cluster`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "server.properties").write_text(render(server_properties(data_dir, node, voters)))
    (data_dir / "log4j2.properties").write_text(
        log4j2.file_config(data_dir / "server.log", {"kafka.request.logger": "warn"})
    )
    if (data_dir / "logs" / "meta.properties").exists():  # a restart keeps its storage
        return
    fmt = [
        *_jvm(data_dir),
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster,
        "-c",
        str(data_dir / "server.properties"),
    ]
    result = subprocess.run(fmt, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        lines = (result.stderr + result.stdout).strip().splitlines() or ["no output"]
        first = next((line for line in lines if "Exception" in line or "rror" in line), lines[0])
        raise error("DEV_KAFKA_FORMAT_FAILED", data_dir=data_dir, reason=first.strip())


def launch(data_dir: Path, *, die_with_parent: bool) -> subprocess.Popen[bytes]:
    """Run the node configured in data_dir (it answers once its quorum has formed)."""
    argv = [*_jvm(data_dir), "kafka.Kafka", str(data_dir / "server.properties")]
    return spawn(argv, log_of(data_dir), die_with_parent=signal.SIGKILL if die_with_parent else None)


def log_of(data_dir: Path) -> Path:
    return data_dir / "kafka.log"


def _jvm(data_dir: Path, archived: bool = True) -> list[str]:
    java = find_java(needed_by="The embedded Kafka broker")
    classpath = maven.classpath(maven.jars("kafka", what=WHAT, instead=INSTEAD))
    scratch = data_dir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return [
        str(java.path),
        f"-Xmx{HEAP}",
        f"-Xms{HEAP}",
        *JVM_FLAGS,
        *(_archive(java.path, classpath) if archived else ()),
        "-Djava.awt.headless=true",
        # Compression codecs unpack native libraries into the temp dir: keep it ours.
        f"-Djava.io.tmpdir={scratch}",
        f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}",
        "-cp",
        classpath,
    ]


def _archive(java: Path, classpath: str) -> list[str]:
    """The options that map the brokers' class-data archive (cds.py), made first, once, by a node
    started and stopped for it: a broker of a test or the demo is killed more often than not,
    and a JVM writes its archive only at an exit of its own."""
    path = cds.archive("kafka-broker", java, classpath)
    if path.exists():
        return cds.mapped(path)
    with cds.making(path) as jvm, tempfile.TemporaryDirectory(prefix="kafka-cds-") as scratch:
        if jvm.makes:
            root = Path(scratch)
            node = Node(1, free_port(), free_port())
            configure(root, node, [node], cluster_id())
            argv = [*_jvm(root, archived=False), *jvm.options, "kafka.Kafka", str(root / "server.properties")]
            proc = spawn(argv, log_of(root), die_with_parent=signal.SIGKILL)
            try:
                ready = lambda: _answers(node.port)  # noqa: E731
                wait_until(ready, proc, what="Kafka broker (its archive)", log=log_of(root), timeout=120)
            finally:
                proc.terminate()  # a controlled shutdown, at whose end the JVM writes the archive
                jvm.succeeded = proc.wait(120) in (0, 143)
    return cds.mapped(path)


def _answers(port: int) -> bool:
    try:
        check_kafka(f"127.0.0.1:{port}", timeout=1)
    except ServiceUnavailable:
        return False
    return True


class Broker:
    """A broker of one run's own (a test's, the demo's), so it can be restarted or killed -9."""

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        *,
        proxied: bool = False,
        users: Mapping[str, str] | None = None,
    ) -> None:
        """proxied: a second listener too, for a fault proxy in front of it (`self.proxied`). users:
        names and passwords of a listener whose clients are authorised by ACLs (`self.secured`)."""
        self.root = root
        wanted = Proxied.new() if proxied else None
        self.secured = Secured(free_port(), tuple(users.items())) if users else None
        self.service: Service = start(
            root, port or free_port(), die_with_parent=True, proxied=wanted, secured=self.secured
        )
        self.proxied = proxied_listener(root)

    @property
    def bootstrap(self) -> str:
        return self.service.env["KAFKA_BOOTSTRAP_SERVERS"]

    def restart(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: a controlled shutdown; SIGKILL: a crash) and start it on the same log."""
        stop(self.service.pid, sig, timeout=60)
        self.service = start(self.root, self.service.port, die_with_parent=True)

    def stop(self) -> None:
        stop(self.service.pid, signal.SIGKILL)


def start_cluster(
    root: Path, size: int, port: int | None = None, *, die_with_parent: bool, proxied: bool = False
) -> list[Service]:
    """`size` combined nodes of one new cluster in root/node1..N, node 1 on `port` if given.

    Each node's Service exports the whole cluster's bootstrap servers.
    """
    nodes = [
        Node(i, (port if i == 1 and port else free_port()), free_port(), Proxied.new() if proxied else None)
        for i in range(1, size + 1)
    ]
    cluster = cluster_id()
    for node in nodes:
        configure(root / f"node{node.id}", node, nodes, cluster)
    bootstrap = ",".join(f"127.0.0.1:{node.port}" for node in nodes)
    services: list[Service] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for node in nodes:
            data_dir = root / f"node{node.id}"
            procs.append(launch(data_dir, die_with_parent=die_with_parent))
            env = {"KAFKA_BOOTSTRAP_SERVERS": bootstrap}
            services.append(
                Service(f"kafka-{node.id}", procs[-1].pid, node.port, data_dir, log_of(data_dir), env)
            )
        for service, proc in zip(services, procs, strict=True):
            wait_for_node(service, proc)
    except BaseException:
        for service in services:
            stop(service.pid, signal.SIGKILL)
        raise
    return services


def proxied_listener(data_dir: Path) -> Proxied | None:
    """The node's proxied listener, as its server.properties has it (None: it has none)."""
    config = read_properties(data_dir / "server.properties")
    ports = [
        int(item.rsplit(":", 1)[1])
        for key in ("listeners", "advertised.listeners")
        for item in config.get(key, "").split(",")
        if item.startswith("PROXIED://")
    ]
    return Proxied(*ports) if ports else None


def node_id(service: Service) -> int:
    return int(read_properties(service.data_dir / "server.properties")["node.id"])


def wait_for_node(service: Service, proc: subprocess.Popen[bytes]) -> None:
    """Until the node answers metadata requests (a node of a cluster: once its quorum formed)."""
    what = f"Kafka node {node_id(service)}"
    log = service.data_dir / "server.log"
    wait_until(lambda: _answers(service.port), proc, what=what, log=log, timeout=180)


# What each broker action does to a node's process: the signal, and whether to wait for it to end.
ACTIONS = {
    "stop": (signal.SIGTERM, True),  # a controlled shutdown: leadership moves first
    "kill": (signal.SIGKILL, True),  # a crash
    "pause": (signal.SIGSTOP, False),  # a stall: alive to the OS, silent to the cluster
    "resume": (signal.SIGCONT, False),
}


def act(service: Service, action: str) -> None:
    """stop, kill, pause or resume one node's process."""
    sig, wait = ACTIONS[action]
    if wait:
        with contextlib.suppress(ProcessLookupError):
            os.kill(service.pid, signal.SIGCONT)  # a paused node must run to stop
        stop(service.pid, sig, timeout=60)
    else:
        os.kill(service.pid, sig)


def restart_node(service: Service, *, die_with_parent: bool) -> Service:
    """Start a stopped or killed node again on its own log; wait until it answers."""
    proc = launch(service.data_dir, die_with_parent=die_with_parent)
    started = Service(service.name, proc.pid, service.port, service.data_dir, service.log, service.env)
    wait_for_node(started, proc)
    return started


class Cluster:
    """`size` combined KRaft nodes of one cluster, each of which can be stopped, killed (-9),
    paused (SIGSTOP), resumed and started again by its node id, as brokers fail in production."""

    def __init__(self, root: Path, size: int = 3, *, proxied: bool = False) -> None:
        """proxied: each node has a second listener too, for a fault proxy in front of it (`proxied`)."""
        started = start_cluster(root, size, die_with_parent=True, proxied=proxied)
        self.services = {node_id(s): s for s in started}
        self.proxied = {node: proxied_listener(s.data_dir) for node, s in self.services.items()}

    @property
    def bootstrap(self) -> str:
        return next(iter(self.services.values())).env["KAFKA_BOOTSTRAP_SERVERS"]

    def kill(self, node: int) -> None:
        act(self.services[node], "kill")

    def stop(self, node: int) -> None:
        act(self.services[node], "stop")

    def pause(self, node: int) -> None:
        act(self.services[node], "pause")

    def resume(self, node: int) -> None:
        act(self.services[node], "resume")

    def start(self, node: int) -> None:
        self.services[node] = restart_node(self.services[node], die_with_parent=True)

    def close(self) -> None:
        """Kill every node; again, nothing."""
        for service in self.services.values():
            act(service, "kill")
        self.services = {}
