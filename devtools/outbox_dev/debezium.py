"""Debezium's PostgreSQL connector on a Kafka Connect worker, run from Maven's jars
(`jvm/poms/debezium.xml`): the relay's peer in bench/relay.py and the judge of
`outbox db adopt-debezium` in its tests.

Why Connect and not Debezium Server or the embedded engine: Connect is how
platform teams run Debezium (and Debezium Server 3.x wants Java 21).
- At least once: a standalone worker keeps its offsets in a file flushed every
  `offset.flush.interval.ms` (Connect's default, 60 s), which is what a kill -9
  replays from, as in any Connect deployment without KIP-618.
- Exactly once: a distributed worker (a cluster of one) with
  `exactly.once.source.support=enabled` (KIP-618): the connector's records
  and its offsets go to Kafka in one transaction per poll, its offsets and
  configuration in Connect's internal topics.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql

from outbox.core.config import DatabaseUrl
from outbox.core.java import find_java
from outbox_dev.errors import error
from outbox_dev.jvm import log4j2, maven
from outbox_dev.kafka import render
from outbox_dev.process import free_port, spawn, stop


def worker(bootstrap: str, work: Path, port: int, group: str | None = None) -> dict[str, str]:
    """A standalone worker's settings; with `group`, a distributed worker's, exactly once."""
    common = {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "listeners": f"http://127.0.0.1:{port}",
        "plugin.discovery": "only_scan",
    }
    if group is None:
        return {**common, "offset.storage.file.filename": str(work / "offsets")}
    internal = {
        f"{kind}.storage.{key}": value
        for kind in ("config", "offset", "status")
        for key, value in (("topic", f"{group}-{kind}s"), ("replication.factor", "-1"))
    }
    return {
        **common,
        **internal,
        "group.id": group,
        "exactly.once.source.support": "enabled",
        # A cluster of one: a worker that comes back after a kill -9 gets its connector at once,
        # not after the default 5 minutes held for the lost member, nor its session's 10 s.
        "scheduled.rebalance.max.delay.ms": "0",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "2000",
    }


def source(url: DatabaseUrl, slot: str, tables: list[str]) -> dict[str, str]:
    """The connector's settings that say where it reads: the server, the tables, its own slot and
    publication (both named `slot`), from now on (no snapshot)."""
    parts = urlsplit(url.raw)
    return {
        "name": slot,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": parts.hostname or "127.0.0.1",
        "database.port": str(parts.port or 5432),
        "database.user": unquote(parts.username or "postgres"),
        "database.password": url.password or "",
        "database.dbname": parts.path.lstrip("/"),
        "topic.prefix": slot,
        "table.include.list": ",".join(tables),
        "slot.name": slot,
        "publication.name": slot,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "no_data",
    }


class Debezium:
    """One connector on one worker; start, kill (-9 or not) and start again on its offsets.

    connector: the connector's settings but `source`'s, which are added here.
    exactly_once: a distributed worker with KIP-618's exactly-once source support, the
    connector asking for it (`exactly.once.support=required`), a transaction per poll.
    flush_ms: a standalone worker's `offset.flush.interval.ms` (Connect's default: 60 s).
    worker_settings: more of the worker's settings (converters, say).
    """

    def __init__(
        self,
        work: Path,
        url: DatabaseUrl,
        bootstrap: str,
        tables: list[str],
        connector: Mapping[str, str],
        *,
        exactly_once: bool = False,
        flush_ms: int | None = None,
        worker_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.work, self.url = work, url
        self.slot = f"dbz_{'eos_' if exactly_once else ''}{uuid.uuid4().hex[:8]}"
        java = find_java(needed_by="Debezium (Kafka Connect)")
        jars = maven.jars("debezium", what="Debezium's jars", instead="or skip Debezium with --no-debezium")
        work.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        group = self.slot if exactly_once else None
        settings = worker(bootstrap, work, self.port, group) | dict(worker_settings or {})
        if flush_ms is not None:
            settings["offset.flush.interval.ms"] = str(flush_ms)
        (work / "worker.properties").write_text(render(settings))
        self.config = source(url, self.slot, tables) | dict(connector)
        if exactly_once:
            self.config |= {"exactly.once.support": "required", "transaction.boundary": "poll"}
        (work / "connector.properties").write_text(render(self.config))
        (work / "log4j2.properties").write_text(log4j2.file_config(work / "connect.log"))
        main = "ConnectDistributed" if exactly_once else "ConnectStandalone"
        self.argv = [
            str(java.path),
            "-Xmx1g",
            "-XX:-UsePerfData",
            f"-Djava.io.tmpdir={work}",
            f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
            "-cp",
            maven.classpath(jars),
            f"org.apache.kafka.connect.cli.{main}",
            str(work / "worker.properties"),
            *([] if exactly_once else [str(work / "connector.properties")]),
        ]
        self.exactly_once = exactly_once
        self.pid: int | None = None

    def start(self, timeout: float = 120.0) -> None:
        """Start the worker and wait until its connector streams from the slot."""
        proc = spawn(self.argv, self.work / "stdout.log", die_with_parent=signal.SIGKILL)
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        submitted = not self.exactly_once  # a distributed worker takes its connector over REST
        while not (submitted and self._streaming()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise error("DEV_DEBEZIUM_NOT_STREAMING", log=str(self.work / "connect.log"))
            submitted = submitted or self._submit()
            time.sleep(0.2)

    def _submit(self) -> bool:
        """PUT the connector's configuration (again, after a restart: the same one); False until the
        worker's REST API answers."""
        body = json.dumps({k: v for k, v in self.config.items() if k != "name"}).encode()
        call = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/connectors/{self.slot}/config",
            data=body,
            method="PUT",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(call, timeout=10):
                return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.pid is not None:
            stop(self.pid, sig, timeout=60)
            self.pid = None

    def drop_slot(self) -> None:
        self.kill()
        with psycopg.connect(self.url.libpq, autocommit=True) as conn, contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_drop_replication_slot(%s)", [self.slot])
            conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.slot)))

    def _streaming(self) -> bool:
        with psycopg.connect(self.url.libpq, autocommit=True) as conn:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [self.slot]
            ).fetchone()
        return bool(row and row[0])
