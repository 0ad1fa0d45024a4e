"""The executor side of applying in the tasks: one task's share of a batch, in one transaction.

The task copies its rows into a temp table, locks the ledger rows of the
topic-partitions it holds, applies what the ledger has not seen, and commits
rows, outbox events, dead letters and ledger together. A retried, speculative
or orphaned attempt of the same rows waits at that lock, then finds them
applied and skips them. A lost connection, a PostgreSQL restart or a deadlock
with a task writing the same keys starts the transaction over: the ledger
makes a repeat harmless, even after a commit whose answer was lost.

A partition is noticed too: the transaction is `watched`, so a task whose
server stopped answering drops its connection and starts over; the server
ends the lost session, and its locks, once it has been quiet for the sink's
`silence`, so the attempt that follows is not held up by it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_schema

from outbox.core.postgres import connect, keepalive, limit_session, server_limits, watched
from sinks.errors import SinkError
from sinks.postgres import continuity
from sinks.postgres.apply import Counts, apply_rows, summed
from sinks.postgres.clock import STAGES, Clock
from sinks.postgres.retry import with_retries
from sinks.postgres.routing import Lanes
from sinks.postgres.stage import END, StageJob, attempt_id, copy_batch, ends, moved, portions
from sinks.postgres.statements import Statements

COUNTS = (*Counts._fields, "retries")  # BatchResult's names
TIMES = tuple(f"{stage}_seconds" for stage in STAGES)
_REFUSAL = ("refused", "refused_code")  # a refusal's message and code (sinks/errors.py)
_SCHEMA = pa.schema(
    [
        *((c, pa.int64()) for c in COUNTS),
        *((t, pa.float64()) for t in TIMES),
        *((r, pa.string()) for r in _REFUSAL),
        ("ends", pa.list_(END)),  # each topic-partition's next offset once the task committed
        ("declined", pa.string()),  # why a task that reads Kafka itself left its range to Spark (direct.py)
    ]
)
# As a StructType: a DDL string would be parsed by the JVM again at every batch.
TASK_RESULT = from_arrow_schema(_SCHEMA)


@dataclass(frozen=True)
class TaskJob:
    """What a task needs, pickled to the executors."""

    stage: StageJob  # its COPY statements write the task's temp table
    statements: Statements  # built with in_task=True; its spec has the timeouts
    after: tuple[str, int] | None = None  # (query, batch): the batch before it must still be there
    lanes: Lanes | None = None  # a routed sink's split of the rows (routing.py)
    tables: tuple[tuple[StageJob, Statements], ...] = ()  # a routed sink's, in the lanes' order

    @property
    def parts(self) -> tuple[tuple[StageJob, Statements], ...]:
        return self.tables or ((self.stage, self.statements),)


@dataclass(frozen=True)
class Outcome:
    counts: Counts
    refused: str | None = None  # why the sink refused the rows (on_error='fail'); nothing was committed
    refused_code: str | None = None  # the refusal's code
    retries: int = 0


NOTHING = Outcome(Counts(0, 0, 0, 0, 0, 0))


def applier(job: TaskJob) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        clock = Clock()
        # Kept: a transaction that starts over copies them again. Taking them is the input
        # stage: the source, its decoding and Spark's Arrow, upstream of this code.
        with clock.stage("input"):
            rows = [b for b in batches if b.num_rows]
        yield apply_records(job, rows, clock)

    return apply


def apply_records(job: TaskJob, rows: list[pa.RecordBatch], clock: Clock) -> pa.RecordBatch:
    """Apply a task's rows, starting over on a lost connection; its result row."""
    outcome = NOTHING
    if rows:
        attempt, who = attempt_id(job.stage.token), f"sink task (pid {os.getpid()})"
        outcome, retries = with_retries(
            lambda: apply_task(job, rows, attempt, clock), job.statements.spec.retry_for, who
        )
        outcome = replace(outcome, retries=retries)
    return result(outcome, clock, rows)


def result(
    outcome: Outcome, clock: Clock, rows: list[pa.RecordBatch], declined: str | None = None
) -> pa.RecordBatch:
    """A task's one row of TASK_RESULT."""
    refusal = [outcome.refused, outcome.refused_code]
    values = [*outcome.counts, outcome.retries, *clock.seconds.values(), *refusal, ends(rows), declined]
    columns = {f: [v] for f, v in zip(_SCHEMA.names, values, strict=True)}
    return pa.RecordBatch.from_pydict(columns, _SCHEMA)


def apply_task(job: TaskJob, rows: list[pa.RecordBatch], attempt: int, clock: Clock) -> Outcome:
    st = job.statements  # the first table's: the ledger and the batch record are the sink's
    held = firsts(pa.Table.from_batches(rows))
    topics, partitions = [t for t, _ in held], [p for _, p in held]
    params: dict[str, Any] = {
        "sink": st.spec.name,
        "attempts": [attempt],
        "topics": topics,
        "partitions": partitions,
    }
    stages = portions([stage for stage, _ in job.parts], job.lanes, rows)
    parts = [(stage, st_, part) for (_, st_), (stage, part) in zip(job.parts, stages, strict=True) if part]
    spec = st.spec
    # Named in pg_stat_activity, with the process, for whoever looks at who holds a lock.
    name = f"outbox-sink task, pid {os.getpid()}"
    settings = keepalive(spec.database_timeout)
    with connect(
        spec.url, autocommit=True, application_name=name, timeout=spec.database_timeout, settings=settings
    ) as conn:
        try:
            # Statements may rightly run long (a lock wait, a big apply): watched, not bounded.
            with watched(conn, spec.url, spec.database_timeout):
                limit_session(
                    conn, server_limits(spec.database_timeout, spec.silence, bound_statements=False)
                )
                with conn.transaction():
                    dead = []
                    for stage, statements, part in parts:
                        with clock.stage("copy"):
                            conn.execute(statements.create_stage(attempt))
                        dead.append(sum(copy_batch(conn, stage, batch, clock) for batch in part))
                    with clock.stage("lock"):
                        conn.execute(st.claim(), params)
                        ledger = conn.execute(st.lock(), params).fetchall()
                        if job.after is not None:
                            continuity.check(conn, st, *job.after)
                    with clock.stage("apply"):
                        past = past_ledger(held, {(t, p): o for t, p, o in ledger})
                        counts = [
                            apply_rows(
                                conn,
                                statements.past_ledger() if past else statements,
                                params,
                                any(pc.any(b.column("_delete")).as_py() for b in part),
                                found > 0,
                            )
                            for (_, statements, part), found in zip(parts, dead, strict=True)
                        ]
                        if job.lanes is not None:  # the ledger moves once, past rows no table took too
                            conn.execute(st.move_ledger(), {**params, **moved([ends(rows)])})
                    committing = time.perf_counter()
                clock.seconds["commit"] += time.perf_counter() - committing
        except SinkError as exc:  # rolled back: the driver fails the batch with this line
            return replace(NOTHING, refused=exc.message, refused_code=exc.code)
    ignored = sum(b.num_rows for b in rows) - sum(c.staged for c in counts)
    return Outcome(summed(counts)._replace(ignored=ignored))


def firsts(rows: pa.Table) -> dict[tuple[str, int], int | None]:
    """The topic-partitions the task holds, each with its first offset staged (None: a row has none)."""
    least = pc.ScalarAggregateOptions(skip_nulls=False)
    found = rows.group_by(["_topic", "_partition"]).aggregate([("_offset", "min", least)]).to_pydict()
    return dict(
        zip(zip(found["_topic"], found["_partition"], strict=True), found["_offset_min"], strict=True)
    )


def past_ledger(held: dict[tuple[str, int], int | None], ledger: dict[tuple[str, int], int]) -> bool:
    """Whether every staged row is past the ledger (ledger: each topic-partition's next offset,
    read under its lock): then none was applied before, and the stage is applied as it is. A row
    without an offset, which the ledger's filter passes over, goes through the ledger too."""
    return all(first is not None and first >= ledger.get(tp, 0) for tp, first in held.items())
