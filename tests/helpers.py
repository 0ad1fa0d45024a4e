"""Helpers for tests: unique names, killable jobs, Kafka producers and readers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import psycopg
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from outbox.core.committed import read_committed as read_topic
from outbox.core.config import DatabaseUrl
from outbox.core.kafka import client_settings
from outbox_dev import postgres
from outbox_dev.kafka import replicas
from outbox_dev.process import cmdline_contains, descendants, free_port, spawn, stop
from outbox_dev.service import Service

REPO = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` until it holds; fail the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.2)


@contextlib.contextmanager
def busy_cores(log: Path, per_core: int = 3) -> Iterator[None]:
    """Each core this process may run on shared with `per_core` processes that spin at its own
    priority, as on a loaded driver; they are killed as the block ends, or with the test run."""
    argv = [sys.executable, "-c", "while True: pass"]
    count = per_core * len(os.sched_getaffinity(0))
    spinners = [spawn(argv, log, die_with_parent=signal.SIGKILL) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(30)


@contextlib.contextmanager
def fresh_database(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A new, empty database on the server, dropped on leaving."""
    name = unique("test")
    with psycopg.connect(server_url.libpq, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, _ = server_url.raw.rpartition("/")
    try:
        yield DatabaseUrl.parse(f"{base}/{name}")
    finally:
        with psycopg.connect(server_url.libpq, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# Figures a test measured (heal to resume, a soak's tail...), printed at the end of the run (conftest).
MEASURED: list[str] = []


def measured(what: str, seconds: float) -> None:
    reported(what, f"{seconds:7.1f} s")


def reported(what: str, figures: str) -> None:
    MEASURED.append(f"{figures}  {what}")


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
    """A topic replicated as the cluster allows: 3 replicas, 2 in sync, on a cluster of 3 or more."""
    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    factor, in_sync = replicas(len(admin.list_topics(timeout=30).brokers))
    settings = {"min.insync.replicas": str(in_sync), **(config or {})}
    for future in admin.create_topics([NewTopic(name, partitions, factor, config=settings)]).values():
        future.result(30)

    def led() -> bool:  # on a cluster, a broker may learn of the topic a moment later
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        ready = topic is not None and topic.error is None and len(topic.partitions) == partitions
        return ready and all(p.leader >= 0 for p in topic.partitions.values())

    wait_for(led, 30, f"topic {name} led on every partition")
    return name


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    from confluent_kafka.admin import NewPartitions

    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(30)


def transactional_producer(bootstrap: str, transactional_id: str | None = None) -> Producer:
    producer = Producer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": transactional_id or unique("tx"),
                "partitioner": "murmur2_random",
                "linger.ms": 5,
            },
            "producer",
        )
    )
    producer.init_transactions(30)
    return producer


def produce_transaction(
    producer: Producer,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    commit: bool = True,
    partition: int | None = None,
) -> None:
    producer.begin_transaction()
    for key, value in records:
        if partition is None:
            producer.produce(topic, key=key, value=value)
        else:
            producer.produce(topic, key=key, value=value, partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def committed_messages(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[Message]:
    """Every record a fresh read_committed consumer sees from offset 0 up to the end now."""
    messages = read_topic({"bootstrap.servers": bootstrap}, topic, timeout=timeout)
    assert {m.partition() for m in messages} <= set(range(partitions))
    return messages


def read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 10.0) -> list[tuple]:
    """(partition, offset, key, value) of every committed record, from offset 0 up to the high watermark
    now (a transaction still open there is waited for)."""
    return [
        (m.partition(), m.offset(), m.key(), m.value())
        for m in committed_messages(bootstrap, topic, partitions, timeout)
    ]


class Job:
    """A Python program in a child process group that a test can kill -9.

    It also dies if the test run itself is killed (parent-death signal).
    """

    def __init__(self, argv: Sequence[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.process = spawn(
            [sys.executable, *argv],
            log,
            die_with_parent=signal.SIGKILL,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        )

    def kill9(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError(f"job did not finish in {timeout}s; log:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.process.poll() is not None:
                raise AssertionError(
                    f"job exited ({self.process.returncode}) before {text!r}:\n{self.output()}"
                )
            time.sleep(0.1)
        self.kill9()
        raise AssertionError(f"no {text!r} in job output after {timeout}s:\n{self.output()}")


class OwnPostgres:
    """A PostgreSQL server of one test's own, which it may restart, crash, copy or promote.

    durable: configured as production is (fsync, synchronous_commit), so a crash
    loses only what PostgreSQL itself may lose.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        durable: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.durable, self.settings = durable, settings
        self._paused: list[int] = []  # WAL writers SIGSTOPped (pause_wal_writer)
        self.server = self._start(data_dir, port or free_port())
        self.url = DatabaseUrl.parse(self.server.env["DATABASE_URL"])

    def _start(self, data_dir: Path, port: int) -> Service:
        return postgres.start(
            data_dir, port, die_with_parent=True, durable=self.durable, settings=self.settings
        )

    @property
    def port(self) -> int:
        return self.server.port

    def restart(self) -> None:
        """A fast shutdown, which ends every session, then the same server again."""
        self.stop()
        time.sleep(2)
        self.start()

    def start(self) -> None:
        self.server = self._start(self.server.data_dir, self.server.port)

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: SIGQUIT, no checkpoint, WAL not yet flushed is lost."""
        stop(self.server.pid, signal.SIGQUIT, timeout=10)
        self._end_paused()

    def _end_paused(self) -> None:
        """A stopped process takes no SIGQUIT: a paused WAL writer outlived its server, for good."""
        for pid in self._paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._paused = []

    def pause_wal_writer(self) -> None:
        """SIGSTOP the WAL writer: asynchronous commits and aborts stay in memory until a
        backend flushes, so a crash loses them (the widest form of the lost-tail window)."""
        writers = [pid for pid in descendants(self.server.pid) if cmdline_contains(pid, "walwriter")]
        assert writers, "no walwriter process found"
        for pid in writers:
            os.kill(pid, signal.SIGSTOP)
        self._paused = writers

    def copy(self, data_dir: Path, *, standby: bool) -> Path:
        """A base backup of this server in data_dir: a streaming replica or, later, a restore."""
        postgres.base_backup(self.port, data_dir, standby=standby)
        return data_dir

    def replica(self, data_dir: Path, *, synchronous: bool) -> OwnPostgres:
        """A streaming replica of this server, durable as it is; `synchronous`: every commit here
        waits for it (set once it streams, or commits would wait for it from the start)."""
        replica = OwnPostgres(self.copy(data_dir, standby=True), durable=self.durable, settings=self.settings)
        if synchronous:
            self.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            self.execute("SELECT pg_reload_conf()")
            try:
                wait_for(
                    lambda: self.execute("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
                    30,
                    "the replica to stream synchronously",
                )
            except BaseException:
                replica.stop()
                raise
        return replica

    def execute(self, query: str, params: Sequence[object] = ()) -> list[tuple]:
        with psycopg.connect(self.url.libpq, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def stop(self) -> None:
        stop(self.server.pid, signal.SIGINT, timeout=30)
        self._end_paused()
