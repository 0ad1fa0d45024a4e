"""The executor side: COPY one task's rows into the stage table.

Each task writes its Arrow batches as CSV (encoded by Arrow, not row by row
in Python) inside one transaction, and reports its attempt id. Only attempts
that Spark reports as successful are applied, so a retried or speculative
task never counts twice. A chunk PostgreSQL refuses is split in halves until
the bad rows are found; those are staged as dead letters with the raw record.

A task that loses its server (a restart, a failover, a partition: its
connection is `watched`, as the applying tasks' are) starts over under an
attempt id of its own: rows a lost try committed, its answer lost, are never
applied.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from pyspark.sql.pandas.types import from_arrow_schema

from outbox.core.postgres import connect, keepalive, limit_session, server_limits, watched
from sinks.postgres.bookkeeping import ATTEMPT_SETTING
from sinks.postgres.clock import Clock
from sinks.postgres.refusal import ROW_ERRORS, reason
from sinks.postgres.retry import with_retries
from sinks.postgres.routing import Lanes
from sinks.postgres.spec import SinkSpec

END = pa.struct([("topic", pa.string()), ("partition", pa.int64()), ("offset", pa.int64())])
_RESULT = pa.schema(
    [
        ("attempt", pa.int64()),
        ("staged", pa.int64()),
        ("dead", pa.int64()),
        ("ignored", pa.int64()),  # a routed sink's rows that no table took (unrouted="ignore")
        ("ends", pa.list_(END)),  # a routed sink's: where the ledger moves, past rows no table took
    ]
)
RESULT_SCHEMA = from_arrow_schema(_RESULT)  # a StructType: a DDL string is parsed again every batch
_CSV = pacsv.WriteOptions(include_header=False)


@dataclass(frozen=True)
class StageJob:
    """What a task needs, pickled to the executors (plain strings only)."""

    copy_rows: bytes  # the COPY statements, rendered on the driver
    copy_dead: bytes
    keys: tuple[int, ...]  # positions of the key columns among the data columns
    names: tuple[str, ...]  # the table's names of the data columns, for error text

    token: int  # random per batch run: attempt ids restart with each SparkContext


def stager(
    jobs: Sequence[StageJob], spec: SinkSpec, lanes: Lanes | None = None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """jobs: the sink's one stage, or a routed sink's stage per lane (`lanes` splits the rows)."""

    def stage(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = [b for b in batches if b.num_rows]  # kept: a try that starts over copies them again
        parts = portions(jobs, lanes, rows)
        tries = itertools.count()
        who = f"sink stager (pid {os.getpid()})"
        (attempt, dead), _ = with_retries(lambda: _stage_once(parts, spec, next(tries)), spec.retry_for, who)
        staged = sum(b.num_rows for _, part in parts for b in part)
        ignored = sum(b.num_rows for b in rows) - staged
        done = {"attempt": attempt, "staged": staged, "dead": dead, "ignored": ignored}
        done["ends"] = ends(rows) if lanes is not None else []
        yield pa.RecordBatch.from_pydict({k: [v] for k, v in done.items()}, _RESULT)

    return stage


def _stage_once(
    parts: list[tuple[StageJob, list[pa.RecordBatch]]], spec: SinkSpec, tries: int
) -> tuple[int, int]:
    """Stage the rows in one transaction: (its attempt id, the dead letters staged). Each try has an
    id of its own: a try whose commit was made but whose answer was lost leaves rows no try reports."""
    attempt = attempt_id(parts[0][0].token, tries)
    name = f"outbox-sink stager, pid {os.getpid()}"
    settings = keepalive(spec.database_timeout)
    conn = connect(spec.url, application_name=name, timeout=spec.database_timeout, settings=settings)
    with conn, watched(conn, spec.url, spec.database_timeout):
        limit_session(conn, server_limits(spec.database_timeout, spec.silence, bound_statements=False))
        conn.execute("SELECT set_config(%s, %s, true)", [ATTEMPT_SETTING, str(attempt)])
        dead = sum(copy_batch(conn, job, batch) for job, part in parts for batch in part)
        conn.commit()
    return attempt, dead


def portions(
    jobs: Sequence[StageJob], lanes: Lanes | None, rows: list[pa.RecordBatch]
) -> list[tuple[StageJob, list[pa.RecordBatch]]]:
    """Each stage's rows: all of them for a sink of one table; each lane's for a routed one."""
    if lanes is None:
        return [(jobs[0], rows)]
    split = [lanes.split(batch) for batch in rows]
    return [(job, [s[i] for s in split if s[i].num_rows]) for i, job in enumerate(jobs)]


def moved(tasks_ends: Iterable[Iterable[Mapping[str, Any]]]) -> dict[str, list[Any]]:
    """`move_ledger`'s parameters from tasks' `ends`: each topic-partition's furthest."""
    far: dict[tuple[str, int], int] = {}
    for end in itertools.chain.from_iterable(tasks_ends):
        at = (end["topic"], end["partition"])
        far[at] = max(far.get(at, 0), end["offset"])
    return {"topics": [t for t, _ in far], "partitions": [p for _, p in far], "ends": list(far.values())}


def ends(rows: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """Where the ledger stands for each topic-partition of `rows` once they are applied."""
    if not rows:
        return []
    found = pa.Table.from_batches(rows).group_by(["_topic", "_partition"]).aggregate([("_offset", "max")])
    return [
        {"topic": t, "partition": p, "offset": o + 1}
        for t, p, o in zip(
            *found.select(["_topic", "_partition", "_offset_max"]).to_pydict().values(), strict=True
        )
    ]


def attempt_id(token: int, tries: int = 0) -> int:
    """This task attempt's id: unique across SparkContexts by the batch run's token (31 bits), and
    across a stager's tries by their count (a task's tries share its Spark attempt id)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return ((token + tries) % (1 << 31)) << 32 | ((context.taskAttemptId() if context else 0) & 0xFFFFFFFF)


def copy_batch(
    conn: psycopg.Connection, job: StageJob, batch: pa.RecordBatch, clock: Clock | None = None
) -> int:
    """COPY one Arrow batch into the stage, its unwritable rows as dead letters; returns how many."""
    rows, bad = split_unwritable(batch, job)
    errors = [*bad.items(), *copy_bisect(conn, job, rows, _kept(batch, bad), clock or Clock())]
    if errors:
        write_dead(conn, job, batch, errors)
    return len(errors)


def split_unwritable(batch: pa.RecordBatch, job: StageJob) -> tuple[pa.RecordBatch, dict[int, str]]:
    """Rows that parsed and have every key column set, and the others' positions with why not."""
    bad: dict[int, str] = {}
    parse_errors = batch.column(len(job.names) + 6)
    for i in pc.indices_nonzero(pc.is_valid(parse_errors)).to_pylist():
        bad[i] = parse_errors[i].as_py()
    for position in job.keys:
        for i in pc.indices_nonzero(pc.is_null(batch.column(position))).to_pylist():
            bad.setdefault(i, f"key column {job.names[position]!r} is null (did the value parse?)")
    if not bad:
        return batch, bad
    keep = pa.array([i not in bad for i in range(batch.num_rows)])
    return batch.filter(keep), bad


def _kept(batch: pa.RecordBatch, bad: dict[int, str]) -> Sequence[int]:
    return [i for i in range(batch.num_rows) if i not in bad] if bad else range(batch.num_rows)


def copy_bisect(
    conn: psycopg.Connection, job: StageJob, rows: pa.RecordBatch, index: Sequence[int], clock: Clock
) -> list[tuple[int, str]]:
    """COPY `rows`; on a data error, halve until each bad row is found. Returns (original index, error)."""
    if rows.num_rows == 0:
        return []
    with clock.stage("encode"):
        data = to_csv(rows, len(job.names))
    try:
        with clock.stage("copy"), conn.transaction(), conn.cursor().copy(job.copy_rows) as copy:
            copy.write(data)
        return []
    except ROW_ERRORS as exc:
        if rows.num_rows == 1:
            return [(index[0], reason(exc, job.names))]
    half = rows.num_rows // 2
    return copy_bisect(conn, job, rows.slice(0, half), index[:half], clock) + copy_bisect(
        conn, job, rows.slice(half), index[half:], clock
    )


def to_csv(rows: pa.RecordBatch, data_columns: int) -> bytes:
    """Data columns and position/delete flag as CSV, timestamps in UTC, years before 1 as BC."""
    columns = [_bc(_utc(rows.column(i))) for i in range(data_columns + 4)]
    out = io.BytesIO()
    pacsv.write_csv(pa.RecordBatch.from_arrays(columns, [f"c{i}" for i in range(len(columns))]), out, _CSV)
    return out.getvalue()


def _utc(column: pa.Array) -> pa.Array:
    kind = column.type
    if pa.types.is_timestamp(kind) and kind.tz is not None and kind.tz != "UTC":
        return column.cast(pa.timestamp(kind.unit, "UTC"))
    return column


_YEAR = r"^-?\d+"  # the year Arrow writes first: 0000 for 1 BC, -0044 for 45 BC


def _bc(column: pa.Array) -> pa.Array:
    """A date or timestamp column as PostgreSQL reads years before 1: Arrow writes ISO's year 0 and
    negative years (0000-06-15, -0044-03-15), which PostgreSQL refuses; it wants 0001-06-15 BC and
    0045-03-15 BC. Only a column holding such a year is written as text."""
    kind = column.type
    if not (pa.types.is_date(kind) or pa.types.is_timestamp(kind)) or column.null_count == len(column):
        return column
    before = pc.less(pc.year(column), 1)
    if not pc.any(before).as_py():
        return column
    text = column.cast(pa.string())
    year = pc.cast(pc.subtract(1, pc.year(column)), pa.string())
    bc = pc.binary_join_element_wise(
        pc.utf8_lpad(year, 4, "0"), pc.replace_substring_regex(text, _YEAR, ""), " BC", ""
    )
    return pc.if_else(before, bc, text)


def write_dead(
    conn: psycopg.Connection, job: StageJob, batch: pa.RecordBatch, errors: list[tuple[int, str]]
) -> None:
    meta = len(job.names)
    topic, partition, offset = (batch.column(meta + i) for i in range(3))
    raw_key, raw_value = batch.column(meta + 4), batch.column(meta + 5)
    with conn.cursor().copy(job.copy_dead) as copy:
        for i, why in sorted(errors):
            copy.write_row(
                (
                    topic[i].as_py(),
                    partition[i].as_py(),
                    offset[i].as_py(),
                    False,
                    why.replace("\x00", "\\u0000"),  # quoting the value: PostgreSQL text holds no NUL
                    raw_key[i].as_py(),
                    raw_value[i].as_py(),
                )
            )
