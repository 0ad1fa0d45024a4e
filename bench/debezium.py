"""Debezium, the relay's peer in bench/relay.py: its PostgreSQL connector and outbox EventRouter
on a Kafka Connect standalone worker, run from Maven's jars (outbox/jvm/poms/debezium.xml).

Why Connect and not Debezium Server or the embedded engine: Connect is how
platform teams run Debezium (and Debezium Server 3.x wants Java 21). A
standalone worker keeps its offsets in a file flushed every
`offset.flush.interval.ms` (Connect's default, 60 s), which is what a kill -9
replays from: Debezium is at-least-once here, as in any Connect deployment
without KIP-618's exactly-once source support (a distributed cluster).
The connector reads our own outbox table (`outbox_events`) through a logical
replication slot with pgoutput, and the EventRouter routes each row by its
`topic` column, keys it by `key`, and puts `event_id` in a header, as the relay does.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql

from core import tables
from core.config import DatabaseUrl
from core.errors import ConfigError
from outbox.dev.kafka import render
from outbox.dev.process import free_port, spawn, stop
from outbox.jvm import log4j2, maven
from outbox.jvm.java import find_java


def worker(bootstrap: str, work: Path, port: int) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "offset.storage.file.filename": str(work / "offsets"),
        "listeners": f"http://127.0.0.1:{port}",
        "plugin.discovery": "only_scan",
    }


def connector(url: DatabaseUrl, schema: str, slot: str) -> dict[str, str]:
    parts = urlsplit(url.raw)
    table = f"{schema}.{tables.OUTBOX_EVENTS}"
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
        "table.include.list": table,
        # Our table's columns Debezium has no use for (xid8 and bytea[] it cannot map).
        "column.exclude.list": ",".join(f"{table}.{c}" for c in ("txid", "header_keys", "header_values")),
        "slot.name": slot,
        "publication.name": slot,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "no_data",
        "binary.handling.mode": "bytes",
        # Tuned as Debezium's performance advice goes: bigger batches and queue, a short
        # poll interval, a producer that batches (defaults: 2048, 8192, 500 ms, linger 0).
        "max.batch.size": "10240",
        "max.queue.size": "40960",
        "poll.interval.ms": "50",
        "producer.override.linger.ms": "5",
        "producer.override.batch.size": "524288",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "key",
        "transforms.outbox.table.field.event.payload": "value",
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        "transforms.outbox.table.fields.additional.placement": "event_id:header:event_id",
    }


class Debezium:
    """One connector on one standalone worker; start, kill (-9 or not) and start again on its offsets."""

    def __init__(self, work: Path, url: DatabaseUrl, bootstrap: str, schema: str = "public") -> None:
        self.work, self.url = work, url
        self.slot = f"bench_dbz_{int(time.time())}"
        java = find_java(needed_by="Debezium (Kafka Connect)")
        jars = maven.jars("debezium", what="Debezium's jars", instead="or skip Debezium with --no-debezium")
        work.mkdir(parents=True, exist_ok=True)
        (work / "worker.properties").write_text(render(worker(bootstrap, work, free_port())))
        (work / "connector.properties").write_text(render(connector(url, schema, self.slot)))
        (work / "log4j2.properties").write_text(log4j2.file_config(work / "connect.log"))
        self.argv = [
            str(java.path),
            "-Xmx1g",
            "-XX:-UsePerfData",
            f"-Djava.io.tmpdir={work}",
            f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
            "-cp",
            maven.classpath(jars),
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(work / "worker.properties"),
            str(work / "connector.properties"),
        ]
        self.pid: int | None = None

    def start(self, timeout: float = 120.0) -> None:
        """Start the worker and wait until its connector streams from the slot."""
        proc = spawn(self.argv, self.work / "stdout.log", die_with_parent=signal.SIGKILL)
        self.pid = proc.pid
        deadline = time.monotonic() + timeout
        while not self._streaming():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ConfigError(f"Debezium did not start streaming: see {self.work / 'connect.log'}")
            time.sleep(0.2)

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
