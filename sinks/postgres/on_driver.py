"""A batch applied on the driver: the executors COPY its rows into the stage table, then the driver
applies them with the ledger in one transaction, holding the sink's lock from the one to the other."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from pyspark.sql import DataFrame

from sinks.postgres.apply import BatchResult, apply_batch
from sinks.postgres.lanes import Lane
from sinks.postgres.session import DriverSession, unlock
from sinks.postgres.stage import RESULT_SCHEMA, StageJob, moved, stager

__all__ = ["OnDriver", "Staged"]

log = logging.getLogger("sinks.postgres")


@dataclass(frozen=True)
class Staged:
    """A batch the executors staged, not yet applied."""

    batch_id: int
    attempts: list[int]  # task attempts whose rows count (retried tasks' leftovers do not)
    rows: int
    conn: psycopg.Connection  # holds the sink's advisory lock until the batch is applied
    seconds: float  # the staging job took
    query: str | None  # the streaming query's id, recorded with the batch
    ends: dict[str, list[Any]] | None = None  # a routed sink's: where its ledger moves (stage.moved)
    ignored: int = 0  # a routed sink's rows that no table took


class OnDriver(DriverSession):
    """BatchWriter's driver path (writer.py): staged by the executors, then applied here."""

    _stage_jobs: tuple[StageJob, ...]

    def stage(self, batch: DataFrame, batch_id: int) -> Staged:
        """Copy the batch into the stage table from the executors; nothing is applied yet.

        Takes the sink's advisory lock until `apply` ends: two queries writing one
        sink would share its stage table, so the second one fails at once instead.
        """
        start, query = time.perf_counter(), self.query_id(batch)
        conn = self._connect()
        try:
            with self.watched(conn):
                self._lock(conn)
            self._check(conn, query, batch_id)
        except BaseException:
            conn.close()  # the stage table is the other writer's: leave it alone
            raise
        try:
            with self.watched(conn):
                for lane in self.lanes:
                    conn.execute(lane.statements.create_stage())
            token = secrets.randbits(31)
            jobs = [replace(job, token=token) for job in self._stage_jobs]
            stage = stager(jobs, self.spec, self._task_job.lanes)
            tasks = batch.select(*self._columns).mapInArrow(stage, RESULT_SCHEMA).collect()
        except BaseException:
            _drop_stage(conn, self.lanes)
            raise
        attempts, rows = [t.attempt for t in tasks], sum(t.staged for t in tasks)
        ends = moved(t.ends for t in tasks) if self._task_job.lanes is not None else None
        seconds, ignored = time.perf_counter() - start, sum(t.ignored for t in tasks)
        return Staged(batch_id, attempts, rows, conn, seconds, query, ends, ignored)

    def apply(self, staged: Staged) -> BatchResult:
        """Apply a staged batch in one transaction with the ledger; a replay changes nothing."""
        start = time.perf_counter()
        try:
            with self.watched(staged.conn):
                result = apply_batch(
                    staged.conn,
                    [lane.statements for lane in self.lanes],
                    staged.batch_id,
                    staged.attempts,
                    staged.rows,
                    self._batch(staged.query, staged.batch_id) if staged.query else None,
                    staged.ends,
                )
        except BaseException:
            _drop_stage(staged.conn, self.lanes)  # a failed batch leaves nothing behind
            raise
        took = time.perf_counter() - start
        self.last = replace(result, stage_seconds=staged.seconds, apply_seconds=took, ignored=staged.ignored)
        with staged.conn, self.watched(staged.conn):
            if staged.query:
                self._report(staged.conn, staged.query, self.last)
            unlock(staged.conn)
        log.info("sink %s: %s", self.spec.name, self.last)
        return self.last


def _drop_stage(conn: psycopg.Connection, lanes: Sequence[Lane]) -> None:
    """Drop the stage tables, if the connection still works, and close it, the lock freed."""
    try:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            for lane in lanes:
                conn.execute(lane.statements.drop_stage())
    except psycopg.Error as exc:
        log.warning("sink %s: could not drop the stage table: %s", lanes[0].spec.name, exc)
    finally:
        unlock(conn)
        conn.close()
