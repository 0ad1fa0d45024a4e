"""BatchWriter: the foreachBatch function, checked against the table at start, that applies each
micro-batch in the tasks where the frame's plan proves it can (in_tasks.py), else staged and on the
driver (on_driver.py).

At start `BatchWriter.__init__` reads the tables and the ledger, then proves from the frame's plan
where the batches can be applied; its steps are the functions below it, run in the order it lists
them, for a step may rest on one before it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame

from outbox.core import tables
from outbox.core.errors import OutboxError
from outbox.core.postgres import connect, pooled, scalar
from sinks.errors import error, raised_in_tasks
from sinks.postgres import direct
from sinks.postgres.apply import BatchResult
from sinks.postgres.columns import delete_rule, routed_columns, staged_columns
from sinks.postgres.in_tasks import InTasks
from sinks.postgres.lanes import Lane, planned_lane, stage_job, wanted
from sinks.postgres.on_driver import OnDriver
from sinks.postgres.placement import choose
from sinks.postgres.retry import with_retries
from sinks.postgres.routing import Delete, Lanes, Routing
from sinks.postgres.session import LOCK_KEY
from sinks.postgres.spark_plan import is_connect, read_plan
from sinks.postgres.spec import SinkSpec
from sinks.postgres.statements import Statements
from sinks.postgres.task import TaskJob
from sinks.postgres.topics import TopicCheck

__all__ = ["BatchWriter"]

log = logging.getLogger("sinks.postgres")

# Each lane's spec, its delete rule and the frame's fields it names (lanes.wanted).
_Wanted = Sequence[tuple[SinkSpec, Delete, Sequence[str] | None]]


class BatchWriter(OnDriver, InTasks):
    """Applies each micro-batch: in the tasks where the frame allows it, else staged then on the driver."""

    def __init__(
        self,
        spec: SinkSpec,
        frame: DataFrame,
        delete: Delete,
        kafka: Mapping[str, str] | None = None,
        checkpoint: str | None = None,
        routing: Routing | None = None,
    ) -> None:
        self.spec = spec
        self.checkpoint = checkpoint
        self._query = None
        if checkpoint is None and is_connect(frame):
            log.warning(
                "sink %s: on Spark Connect the writer reads the query's id in its checkpoint; without"
                " sink.writer(frame, checkpoint_location) it cannot check that PostgreSQL lost no batch",
                spec.name,
            )
        if routing is not None and isinstance(routing.by, str) and routing.by not in frame.columns:
            raise error("SINK_ROUTE_COLUMN_ABSENT", by=routing.by, columns=frame.columns)
        with connect(spec.url) as conn:
            _require_tables(conn, spec)
            lanes_wanted = wanted(spec, delete, routing)
            self.lanes = tuple(
                planned_lane(conn, frame.schema, lane_spec, rule, columns, None if routing is None else i)
                for i, (lane_spec, rule, columns) in enumerate(lanes_wanted)
            )
            self.plan, self.statements = self.lanes[0].plan, self.lanes[0].statements
            self._stage_jobs = tuple(stage_job(conn, lane, lane.statements) for lane in self.lanes)
            self._task_job = _task_job(conn, self.lanes, routing)
            _tidy(conn, spec, self.lanes)
        _warn_tombstones(spec, lanes_wanted, self.lanes)
        # Built once: each is a call into the JVM (or a proto), and a batch would pay them all again.
        rules = [
            delete_rule(rule, lane.plan) for (_, rule, _), lane in zip(lanes_wanted, self.lanes, strict=True)
        ]
        self._columns, probe = _staging(frame, self.lanes, rules, routing)
        # Proven with the delete rules and the route, which the tasks compute too: a window is a shuffle.
        root, position = read_plan(probe)
        self.route = choose(root, position, spec.apply_in)
        self._topics = TopicCheck(root, kafka or {}, spec.name, spec.ledger_schema)
        self._topics.check_ledgers(spec.url)
        self.last = None
        log.info("sink %s %s", spec.name, self.route)
        self._schema = None
        self._declined_whole = 0
        self.reads_kafka = self._reads_kafka(frame, delete)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Apply the batch; on a lost connection or an unreachable server, all over again (the
        ledger skips what a first try applied) for up to the spec's `retry_for`, so a query
        outlives a blip of the network or a PostgreSQL restart instead of failing."""

        def once() -> BatchResult:
            if self.route.tasks:
                return self.apply_in_tasks(batch, batch_id)
            return self.apply(self.stage(batch, batch_id))

        try:
            with_retries(once, self.spec.retry_for, f"sink {self.spec.name}, batch {batch_id}")
        except OutboxError:
            raise
        except Exception as exc:  # Spark's, around what a task raised: that alone stops the query
            if (ours := raised_in_tasks(exc)) is None:
                raise
            raise ours from None


def _require_tables(conn: psycopg.Connection, spec: SinkSpec) -> None:
    """The framework's tables the sink writes, there and migrated (outbox.core.tables.require)."""
    used = (tables.SINK_PROGRESS, tables.SINK_DEAD_LETTERS, tables.SINK_BATCHES, tables.SINK_TOPICS)
    tables.require(conn, spec.url, spec.ledger_schema, used + ((tables.SINK_TRACES,) if spec.trace else ()))


def _task_job(conn: psycopg.Connection, lanes: Sequence[Lane], routing: Routing | None) -> TaskJob:
    """What each task applies with: each lane's COPY into the task's own stage and its statements,
    and for a routed sink, how a task splits its rows into the lanes."""
    in_task = tuple((stage_job(conn, lane, lane.in_task), lane.in_task) for lane in lanes)
    split = None
    if routing is not None:
        widths = tuple(len(lane.plan.columns) for lane in lanes)
        split = Lanes(tuple(routing.tables), widths, routing.unrouted, routing.described)
    return TaskJob(*in_task[0], lanes=split, tables=in_task if split else ())


def _tidy(conn: psycopg.Connection, spec: SinkSpec, lanes: Sequence[Lane]) -> None:
    """Before the first batch: what a killed batch left is dropped, and what looks amiss is said."""
    _drop_stale_stage(conn, spec, lanes)
    for lane in lanes:
        _warn_emptied(conn, spec, lane)
    if pooled(conn):
        log.warning(
            "sink %s: PostgreSQL is reached through a connection pooler: in transaction mode the"
            " sink's lock, one query a sink at a time, does not hold (session mode does)",
            spec.name,
        )


def _drop_stale_stage(conn: psycopg.Connection, spec: SinkSpec, lanes: Sequence[Lane]) -> None:
    """Drop the stage tables a killed staged batch left, unless a live query holds the sink."""
    if scalar(conn.execute(f"SELECT pg_try_advisory_xact_lock({LOCK_KEY})", [spec.name])):
        for lane in lanes:
            conn.execute(lane.statements.drop_stage())


def _warn_emptied(conn: psycopg.Connection, spec: SinkSpec, lane: Lane) -> None:
    """Say so when the lane's table is empty while the ledger says the sink applied offsets."""
    if not _emptied(conn, lane.statements):
        return
    progress = sql.Identifier(spec.ledger_schema, tables.SINK_PROGRESS).as_string(conn)
    log.warning(
        "sink %s: %s.%s is empty, but the sink's ledger says it applied offsets to it, and"
        " skips them: to rebuild the table from the topic, DELETE FROM %s WHERE sink = %s"
        " and start the query from earliest with a new checkpoint (if the sink's own"
        " deletes emptied it, nothing is amiss)",
        spec.name,
        lane.spec.schema,
        lane.spec.table,
        progress,
        sql.Literal(spec.name).as_string(conn),
    )


def _emptied(conn: psycopg.Connection, st: Statements) -> bool:
    """Bookkeeping.emptied, as advice: a table locked (a TRUNCATE not yet committed) or slow to
    scan (the dead rows of a DELETE) is passed over, not waited for."""
    try:
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '1s'; SET LOCAL statement_timeout = '5s'")
            return bool(scalar(conn.execute(st.emptied(), {"sink": st.spec.name})))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
        return False


def _warn_tombstones(spec: SinkSpec, lanes_wanted: _Wanted, lanes: Sequence[Lane]) -> None:
    """Say so when a lane deletes on tombstones but the frame lost the `value` column that tells them."""
    for (_, rule, _), lane in zip(lanes_wanted, lanes, strict=True):
        if direct.tombstones(rule) and lane.plan.raw_value is None:
            log.warning(
                "sink %s: delete='tombstone' reads Kafka's binary `value` column, which the frame does"
                " not have (cast to text or dropped): no record deletes its key, and a tombstone"
                " upserts it with empty columns. Keep `value` as Kafka gives it, or pass delete=None"
                " or a rule",
                spec.name,
            )


def _staging(
    frame: DataFrame, lanes: Sequence[Lane], rules: list[Column], routing: Routing | None
) -> tuple[list[Column], DataFrame]:
    """The columns the tasks take (columns.py), and the frame the placement is proven on: the
    frame with the delete rules and the route, which the tasks compute too."""
    if routing is None:
        return staged_columns(lanes[0].plan, rules[0]), frame.select("*", rules[0].alias("_delete"))
    columns = routed_columns([lane.plan for lane in lanes], rules, routing.column())
    probe = frame.select("*", *(r.alias(f"_delete{i}") for i, r in enumerate(rules)), routing.column())
    return columns, probe
