"""A batch applied in the tasks: each task its own topic-partitions' rows in one transaction with
the ledger, from Spark's rows or from the Kafka records it reads itself (direct.py); the driver
records the batch once every task committed."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import psycopg
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from sinks.errors import SinkError, error
from sinks.ledger import Positions, positions
from sinks.postgres import direct
from sinks.postgres.apply import BatchResult
from sinks.postgres.clock import STAGES
from sinks.postgres.continuity import behind
from sinks.postgres.retry import MOMENTARY
from sinks.postgres.routing import Delete
from sinks.postgres.session import DriverSession
from sinks.postgres.spark_plan import is_connect, planned_tasks, read_plan
from sinks.postgres.task import COUNTS, TASK_RESULT, TIMES, applier

__all__ = ["InTasks"]

log = logging.getLogger("sinks.postgres")

# Batches in a row whose every range the reading tasks declined (values past Spark's parser's limits,
# say): each was read twice, so the tasks stop reading them.
_DECLINED_WHOLE = 3


class InTasks(DriverSession):
    """BatchWriter's tasks path (writer.py); `reads_kafka` is its tasks' job where they read Kafka."""

    reads_kafka: direct.DirectJob | None
    _schema: Any  # the frame's, where the tasks read Kafka: its batches must have it
    _declined_whole: int

    def _reads_kafka(self, frame: DataFrame, delete: Delete) -> direct.DirectJob | None:
        """The job of tasks that read the batches' Kafka records themselves (direct.py), if they can."""
        values, connect = direct.values_of(frame), is_connect(frame)
        if not self.spec.read_kafka:
            why: str | None = "read_kafka=False"
        elif self._task_job.lanes is not None:
            why = "a routed sink's tasks take Spark's rows"
        else:
            source = read_plan(values.source)[0] if values is not None and not connect else None
            why = direct.why_not(values, self.plan, delete, self.route, source, connect)
        if why is not None or values is None or self._topics.options is None:
            log.info("sink %s: its tasks take the batches' rows from Spark: %s", self.spec.name, why)
            return None
        log.info("sink %s: its tasks read the batches' Kafka records themselves", self.spec.name)
        self._schema = frame.schema
        parse = direct.parse_for(values, self.plan, delete)
        return direct.DirectJob(self._task_job, parse, self._topics.options, waits=True)

    def apply_in_tasks(self, batch: DataFrame, batch_id: int) -> BatchResult:
        """Each task applies its topic-partitions' rows in a transaction of its own, ledger included.

        The batch is recorded once every task committed, in a later commit: a
        database that still shows it still holds every task's commit.
        """
        query = self.query_id(batch)
        with self.exclusive() as conn:
            self._check(conn, query, batch_id)
            done = self._run_tasks(batch, (query, batch_id) if query else None)
            result = self.summarize(batch_id, done)
            ends = {(e.topic, e.partition): e.offset for task in done for e in task.ends}
            self._record_after_tasks(conn, query, result, ends)
        return result

    def _record_after_tasks(
        self, conn: psycopg.Connection, query: str | None, result: BatchResult, ends: Positions
    ) -> None:
        """Record the batch and its outcome once the ledger shows every task's commit (continuity.
        behind); if PostgreSQL restarted under the batch (its tasks retried), on a new session."""

        def record(conn: psycopg.Connection) -> list[tuple[str, int]]:
            """The topic-partitions whose commit is gone; the batch recorded if none."""
            gone = behind(positions(conn, self.spec.ledger_schema, self.spec.name), ends)
            if not gone and query:
                conn.execute(self.statements.record_batch(), self._batch(query, result.batch_id))
                self._report(conn, query, result)
            return gone

        try:
            with self.watched(conn):
                gone = record(conn)
        except MOMENTARY:  # the connection lost, not the verdict: that is raised once, below
            with self._connect() as again, self.watched(again):
                gone = record(again)
        if gone:
            which = ", ".join(f"{t}-{p}" for t, p in gone)
            raise error("SINK_TASK_COMMIT_LOST", sink=self.spec.name, batch=result.batch_id, partitions=which)

    def tasks(self, batch: DataFrame, after: tuple[str, int] | None = None) -> DataFrame:
        """The batch's tasks, one result row each once its transaction committed; lazy until collected.

        after: (query, batch id), whose batch before the database must still show as each task
        commits (continuity.check)."""
        job = replace(self._task_job, after=after)
        return batch.select(*self._columns).mapInArrow(applier(job), TASK_RESULT)

    def _run_tasks(self, batch: DataFrame, after: tuple[str, int] | None) -> list[Row]:
        """The batch's tasks' rows: read from Kafka by the tasks where they can, else from Spark's rows;
        the topic-partitions of a reading task that declined are applied from Spark's rows of them."""
        if self.reads_kafka is None:
            return self.tasks(batch, after).collect()
        # The frame this writer was made for, as its batches are: read_kafka trusts nothing after it.
        planned = planned_tasks(batch) if batch.schema == self._schema else None
        job = direct.for_batch(self.reads_kafka, planned, after) if planned else None
        if job is None:
            if planned != []:
                self._read_no_more(
                    "the batch's offset ranges cannot be read, or its frame is not the writer's"
                )
            return self.tasks(batch, after).collect()
        tasks = batch.sparkSession.range(0, len(job.tasks), 1, len(job.tasks))
        done = tasks.mapInArrow(direct.reader(job), TASK_RESULT).collect()  # a row a task, in order
        declined = [(ranges, d.declined) for ranges, d in zip(job.tasks, done, strict=True) if d.declined]
        self._declined_whole = self._declined_whole + 1 if len(declined) == len(done) else 0
        if not declined:
            return done
        pairs = [(r.topic, r.partition) for ranges, _ in declined for r in ranges]
        read = sum(len(ranges) for ranges in job.tasks)
        log.warning(
            "sink %s: %d of %d topic-partitions applied from Spark's rows, not read by the tasks: %s",
            self.spec.name,
            len(pairs),
            read,
            declined[0][1],
        )
        if self._declined_whole >= _DECLINED_WHOLE:
            self._read_no_more(f"its tasks declined every range of {_DECLINED_WHOLE} batches in a row")
        if len(pairs) == read:  # Spark's rows of them all: no filter to build
            return self.tasks(batch, after).collect()
        wanted = F.struct(F.col("topic"), F.col("partition"))
        only = wanted.isin([F.struct(F.lit(t), F.lit(p)) for t, p in pairs])
        return [d for d in done if not d.declined] + self.tasks(batch.where(only), after).collect()

    def _read_no_more(self, why: str) -> None:
        log.warning("sink %s: %s; its tasks take Spark's rows from now on", self.spec.name, why)
        self.reads_kafka = None

    def summarize(self, batch_id: int, done: list[Row]) -> BatchResult:
        """The batch's result from its tasks' rows; a task's refusal fails the batch with its line."""
        refused = [r for r in done if r.refused]
        if refused:  # raised again as the task raised it: its message and code
            raise SinkError(refused[0].refused, code=refused[0].refused_code)
        counts = {c: sum(getattr(r, c) for r in done) for c in COUNTS}
        stages = {stage: sum(getattr(r, t) for r in done) for stage, t in zip(STAGES, TIMES, strict=True)}

        def slowest(*parts: str) -> float:
            return max((sum(getattr(r, f"{p}_seconds") for p in parts) for r in done), default=0.0)

        staging, applying = slowest("encode", "copy"), slowest("lock", "apply", "commit")
        self.last = BatchResult(
            batch_id, **counts, stage_seconds=staging, apply_seconds=applying, stages=stages
        )
        log.info("sink %s: %s", self.spec.name, self.last)
        return self.last
