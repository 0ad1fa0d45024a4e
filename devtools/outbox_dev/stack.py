"""The set of local services a developer, a test run or the demo needs.

A service named by an environment variable (DATABASE_URL,
KAFKA_BOOTSTRAP_SERVERS) is used as is and never started. Everything else is
started under one root directory whose `state.json` records what runs, so
`up` is idempotent and `down` (or the next `up`) cleans up after a run that
was killed: leftover processes are found by their command line naming the
root, not by trusting a pid alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.core.config import DATABASE_URL, KAFKA_BOOTSTRAP_SERVERS
from outbox_dev import kafka, postgres, registry
from outbox_dev.errors import error
from outbox_dev.process import choose_port, cmdline_contains, pid_alive, stop
from outbox_dev.service import Service

STATE_FILE = "state.json"
# Which variable, when set, means "use this, do not start one".
PROVIDES = {
    "postgres": DATABASE_URL,
    "kafka": KAFKA_BOOTSTRAP_SERVERS,
    "registry": registry.SCHEMA_REGISTRY_URL,
}
# What starts unless asked otherwise: the schema registry only when asked for (`--registry`).
DEFAULT_SERVICES = ("postgres", "kafka")
_STARTERS: dict[str, Callable[..., Any]] = {
    "postgres": postgres.start,
    "kafka": kafka.start,
    "registry": registry.start,
}
_PORT_FLAGS = {"postgres": "--pg-port", "kafka": "--kafka-port", "registry": "--registry-port"}
# SIGINT: PostgreSQL's fast shutdown.
_STOP_SIGNALS = {"postgres": signal.SIGINT, "kafka": signal.SIGTERM, "registry": signal.SIGTERM}


@dataclass
class Status:
    running: dict[str, Service] = field(default_factory=dict)
    dead: list[str] = field(default_factory=list)
    given: dict[str, str] = field(default_factory=dict)  # service -> env var that provides it

    @property
    def exports(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for service in self.running.values():
            out.update(service.env)
        return out


class Stack:
    def __init__(
        self,
        root: Path,
        environ: Mapping[str, str] | None = None,
        services: Iterable[str] = DEFAULT_SERVICES,
    ) -> None:
        self.root = root.resolve()
        self.environ = os.environ if environ is None else environ
        self.services = tuple(services)

    # -- decisions (no I/O) -------------------------------------------------

    def wanted(self) -> list[str]:
        return [n for n, var in PROVIDES.items() if n in self.services and not self.environ.get(var)]

    def given(self) -> dict[str, str]:
        return {
            name: var for name, var in PROVIDES.items() if name in self.services and self.environ.get(var)
        }

    # -- state --------------------------------------------------------------

    def _load(self) -> dict[str, Service]:
        try:
            data = json.loads((self.root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {name: Service.from_json(entry) for name, entry in data.items()}

    def _save(self, services: dict[str, Service]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps({n: s.to_json() for n, s in services.items()}, indent=2))
        tmp.replace(self.root / STATE_FILE)

    def _is_ours_and_alive(self, service: Service) -> bool:
        return pid_alive(service.pid) and cmdline_contains(service.pid, str(service.data_dir))

    # -- commands -------------------------------------------------------------

    def _running(self) -> dict[str, Service]:
        return {n: s for n, s in self._load().items() if self._is_ours_and_alive(s)}

    def status(self) -> Status:
        status = Status(given=self.given())
        for name, service in self._load().items():
            if self._is_ours_and_alive(service):
                status.running[name] = service
            else:
                status.dead.append(name)
        return status

    def up(
        self,
        *,
        ports: Mapping[str, int | None] | None = None,
        die_with_parent: bool = False,
        durable: bool = False,
        brokers: int = 1,
    ) -> Status:
        """Start what is wanted and not already running; clean up what a killed run left.

        durable: PostgreSQL with fsync and synchronous commits on, as production runs it.
        brokers: Kafka as one node, or as a cluster of that many (services kafka-1..N).
        """
        if brokers < 1:
            raise error("DEV_BROKERS_INVALID", brokers=brokers)
        ports = ports or {}
        services = self._running()
        if not services:
            self._kill_leftovers()
        missing = [name for name in self.wanted() if kind(name) not in map(kind, services)]
        # All ports are checked before anything starts: a bad flag starts nothing.
        chosen = {name: choose_port(ports.get(name), _PORT_FLAGS[name]) for name in missing}
        for name, port in chosen.items():
            data_dir = self.root / name
            shutil.rmtree(data_dir, ignore_errors=True)
            if name == "kafka" and brokers > 1:
                nodes = kafka.start_cluster(data_dir, brokers, port, die_with_parent=die_with_parent)
                services.update({node.name: node for node in nodes})
            else:
                extra = {"durable": durable} if name == "postgres" else {}
                services[name] = _STARTERS[name](data_dir, port, die_with_parent=die_with_parent, **extra)
            self._save(services)
        self._save(services)
        return Status(running=services, given=self.given())

    def broker(self, action: str, node: int) -> str:
        """stop, kill, pause, resume or start one Kafka node by its id; returns what was done."""
        known = self._load()
        name = f"kafka-{node}" if f"kafka-{node}" in known else "kafka" if node == 1 else ""
        if name not in known:
            nodes = sorted(kafka.node_id(s) for n, s in known.items() if kind(n) == "kafka")
            raise error("DEV_BROKER_UNKNOWN", node=node, nodes=nodes or "none; run `outbox dev up`")
        service = known[name]
        alive = self._is_ours_and_alive(service)
        if action == "start":
            if alive:
                raise error("DEV_BROKER_RUNNING", node=node, pid=service.pid)
            known[name] = kafka.restart_node(service, die_with_parent=False)
            self._save(known)
            return f"started Kafka node {node} (pid {known[name].pid})"
        if not alive:
            raise error("DEV_BROKER_NOT_RUNNING", node=node)
        kafka.act(service, action)
        return f"{action}: Kafka node {node} (pid {service.pid})"

    def down(self) -> list[str]:
        """Stop everything under the root and delete it. Returns what was running."""
        stopped = []
        for name, service in self._load().items():
            if self._is_ours_and_alive(service):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(service.pid, signal.SIGCONT)  # a paused node must run to stop
                stop(service.pid, _STOP_SIGNALS[kind(name)])
                stopped.append(name)
        self._kill_leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        return stopped

    def _kill_leftovers(self) -> None:
        """Processes of a killed run that the state file no longer knows about."""
        if not self.root.exists():
            return
        needles = [str(self.root / name) + os.sep for name in PROVIDES]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            if any(cmdline_contains(int(entry.name), needle) for needle in needles):
                stop(int(entry.name))


def kind(name: str) -> str:
    """A service's kind: the nodes kafka-1..N of a cluster are all `kafka`."""
    return name.split("-")[0]


@contextlib.contextmanager
def running(
    root: Path,
    environ: Mapping[str, str] | None = None,
    services: Iterable[str] = DEFAULT_SERVICES,
) -> Iterator[dict[str, str]]:
    """Services for the life of a with-block; they die with this process if it is killed."""
    stack = Stack(root, environ, services)
    try:
        status = stack.up(die_with_parent=True)
        yield status.exports
    finally:
        stack.down()
