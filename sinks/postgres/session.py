"""What both of a BatchWriter's paths share: the state it makes at start, and the driver's session
with PostgreSQL, which holds the sink's lock, is watched while it waits, checks that the database
lost no batch before each one and records each one after it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict
from typing import Any

import psycopg
from pyspark.sql import Column, DataFrame

from outbox.core.errors import ServiceUnavailable
from outbox.core.postgres import connect, keepalive, watched
from sinks.errors import error
from sinks.postgres import continuity
from sinks.postgres.apply import BatchResult
from sinks.postgres.continuity import query_id
from sinks.postgres.lanes import Lane
from sinks.postgres.placement import Route
from sinks.postgres.plan import Plan
from sinks.postgres.spark_plan import is_connect
from sinks.postgres.spec import SinkSpec
from sinks.postgres.statements import Statements
from sinks.postgres.task import TaskJob
from sinks.postgres.topics import TopicCheck

__all__ = ["LOCK_KEY", "DriverSession", "unlock"]

LOCK_KEY = "hashtextextended('outbox-sink:' || %s, 0)"


class DriverSession:
    """The base of BatchWriter (writer.py), whose __init__ sets what is declared here; on_driver.py
    and in_tasks.py add a path each."""

    spec: SinkSpec
    checkpoint: str | None
    lanes: tuple[Lane, ...]
    plan: Plan
    statements: Statements
    route: Route
    last: BatchResult | None
    _query: str | None
    _task_job: TaskJob
    _columns: list[Column]
    _topics: TopicCheck

    @contextmanager
    def exclusive(self) -> Iterator[psycopg.Connection]:
        """Hold the sink's advisory lock: one query writes a sink at a time."""
        with self._connect() as conn:
            with self.watched(conn):
                self._lock(conn)
            try:
                yield conn
            finally:
                with suppress(ServiceUnavailable, psycopg.Error), self.watched(conn):
                    unlock(conn)

    def _connect(self) -> psycopg.Connection:
        """The driver's connection: its kernel gives up on a server gone silent (a partition, a host
        lost in a failover) in about `database_timeout`, as the tasks' do."""
        return connect(self.spec.url, autocommit=True, settings=keepalive(self.spec.database_timeout))

    @contextmanager
    def watched(self, conn: psycopg.Connection) -> Iterator[None]:
        """What the driver asks on a connection that waited idle while the executors worked, dropped
        if the server stops working for it (outbox.core.postgres.watched): a proxy's partition,
        which keepalives do not see, held the batch for ever, after its tasks had moved to the
        server a failover made primary."""
        if conn.closed:
            yield
            return
        with watched(conn, self.spec.url, self.spec.database_timeout):
            yield

    def query_id(self, batch: DataFrame) -> str | None:
        """The streaming query's id. On Spark Connect read once from the checkpoint: the server
        unpickles this writer for each run of the query, so it serves one query only."""
        if self._query is None:
            found = query_id(batch, self.checkpoint)
            if not is_connect(batch):
                return found
            self._query = found
        return self._query

    def _check(self, conn: psycopg.Connection, query: str | None, batch_id: int) -> None:
        """Before a batch: the database lost no batch before it (continuity.py), and the ledger's
        offsets are of the topics Kafka has now (topics.py). Only the first is watched: the second
        waits on Kafka too, and a Kafka stall would leave the session idle long enough to be taken
        for a lost one."""
        with self.watched(conn):
            continuity.check(conn, self.statements, query, batch_id)
        self._topics(conn)

    def _report(self, conn: psycopg.Connection, query: str, result: BatchResult) -> None:
        """The batch's outcome beside its record, where a Spark Connect client reads `sink.last`."""
        params = {**self._batch(query, result.batch_id), "result": json.dumps(asdict(result))}
        conn.execute(self.statements.report_batch(), params)

    def _batch(self, query: str, batch_id: int) -> dict[str, Any]:
        return {"sink": self.spec.name, "query": query, "batch": batch_id}

    def _lock(self, conn: psycopg.Connection) -> None:
        locked = conn.execute(f"SELECT pg_try_advisory_lock({LOCK_KEY})", [self.spec.name]).fetchone()
        if not locked or not locked[0]:
            raise error("SINK_IN_USE", sink=self.spec.name)


def unlock(conn: psycopg.Connection) -> None:
    """Free the sink's advisory lock now, where the connection still works. Closing it frees the lock
    only once the server's backend has ended, a moment later: Spark's replay of a failed batch, or
    the next batch, could meet the lock still held and stop as SINK_IN_USE (a busy host did)."""
    with suppress(psycopg.Error):
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.execute("SELECT pg_advisory_unlock_all()")
