"""The driver side: apply one staged batch in one PostgreSQL transaction.

The rows, the outbox events, the dead letters and the ledger commit together,
and the stage table is dropped in the same transaction, so a batch is either
wholly applied or not at all. A key with several events in the batch has
them applied one after another (statements.py says how); when the table
refuses a row (a CHECK, a foreign key, an index row too large), that round is
applied again in halves under savepoints until the refused rows are found
and dead-lettered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from outbox.core.postgres import scalar
from sinks.errors import error
from sinks.postgres.refusal import ROW_ERRORS, reason
from sinks.postgres.statements import Statements


@dataclass(frozen=True)
class BatchResult:
    batch_id: int
    staged: int  # rows the executors staged
    fresh: int  # of those, not applied before (the rest were replays)
    upserted: int
    deleted: int
    dead: int  # dead-lettered
    stale: int = 0  # of the fresh rows that changed nothing, those refused as older than their row
    ignored: int = 0  # a routed sink's rows that no table took, passed over (unrouted="ignore")
    retries: int = 0  # task transactions started over (lost connection, deadlock)
    stage_seconds: float = 0.0  # in the tasks: the slowest task's COPY; on the driver: the stage job
    apply_seconds: float = 0.0  # in the tasks: the slowest task's apply and commit
    # In the tasks: seconds per stage (sinks.postgres.clock), summed over the batch's tasks.
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        """Rows the ledger had applied already: a batch run again."""
        return self.staged - self.fresh

    @property
    def duplicates(self) -> int:
        """Fresh rows that changed nothing and were not stale: the row held them already."""
        return self.fresh - self.upserted - self.deleted - self.dead - self.stale

    def __str__(self) -> str:
        again = f", {self.retries} task transactions started over" if self.retries else ""
        again += f", {self.ignored} taken by no table" if self.ignored else ""
        return (
            f"batch {self.batch_id}: {self.staged} rows, {self.upserted} upserted, {self.deleted} deleted,"
            f" {self.dead} dead letters, {self.duplicates} duplicates, {self.stale} stale,"
            f" {self.replayed} already applied{again}"
            f" (stage {self.stage_seconds:.2f}s, apply {self.apply_seconds:.2f}s)"
        )


def apply_batch(
    conn: psycopg.Connection,
    tables: Sequence[Statements],
    batch_id: int,
    attempts: list[int],
    staged: int,
    record: dict[str, Any] | None = None,
    ends: dict[str, list[Any]] | None = None,
) -> BatchResult:
    """tables: the sink's one table's statements, or a routed sink's per table, applied in turn.
    record: the parameters of `record_batch()`, committed with the batch (continuity.py).
    ends: a routed sink's `move_ledger` parameters: its ledger moves once, after every table."""
    st = tables[0]
    params: dict[str, Any] = {"sink": st.spec.name, "attempts": attempts}
    with conn.transaction():
        counts = summed([apply_rows(conn, table, params) for table in tables])
        if counts.staged != staged:  # raising here rolls the whole batch back
            raise error("SINK_STAGE_INCOMPLETE", sink=st.spec.name, present=counts.staged, staged=staged)
        for table in tables:
            conn.execute(table.drop_stage())
        if ends is not None:
            conn.execute(st.move_ledger(), {**params, **ends})
        if record:
            conn.execute(st.record_batch(), record)
    return BatchResult(batch_id, **counts._asdict())


class Counts(NamedTuple):
    """What applying staged rows did; the names are BatchResult's."""

    staged: int  # present in the stage table
    fresh: int
    upserted: int
    deleted: int
    dead: int
    stale: int
    ignored: int = 0  # a routed sink's rows that no table took, passed over as asked (routing.py)


def summed(counts: Sequence[Counts]) -> Counts:
    """Several tables' counts as one."""
    return (
        Counts(*(sum(column) for column in zip(*counts, strict=True))) if counts else Counts(0, 0, 0, 0, 0, 0)
    )


def apply_rows(
    conn: psycopg.Connection,
    st: Statements,
    params: dict[str, Any],
    deletes: bool | None = None,
    dead_letters: bool = True,
) -> Counts:
    """Apply the staged rows of `params["attempts"]` inside the open transaction, ledger included.

    deletes: whether a staged row may be a delete, where the caller knows (a task, from its rows:
    True also for a delete staged as a dead letter, which costs a question only); else the stage
    is asked. dead_letters: False where the caller knows no row was staged as a dead letter.

    Whether a key has two rows is asked of PostgreSQL, on the staged rows in the
    table's own types: keys that differ as text may be one value there (a uuid in
    upper and lower case, citext, '1' and '01' into a number).
    """
    fail = st.spec.on_error == "fail"
    # Enough memory to number a batch's events in one in-memory sort, not in temp files.
    conn.execute("SET LOCAL work_mem = '256MB'")
    # Deferred constraints (Django makes every foreign key so) are checked as each statement ends,
    # where a refused row is found and dead-lettered, not at COMMIT, which would fail the batch and
    # every replay of it.
    conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    if fail and (bad := conn.execute(st.first_error(), params).fetchone()):
        topic, partition, offset, why = bad
        raise error(
            "SINK_VALUE_UNPARSED",
            sink=st.spec.name,
            topic=topic,
            partition=partition,
            offset=offset,
            reason=why,
        )
    if deletes is None:
        deletes = scalar(conn.execute(st.deletes(), params))
    if (whole := _in_one_statement(conn, st, params, deletes, dead_letters)) is not None:
        return whole
    upserted, deleted, stale, refused = _apply_in_rounds(conn, st, params, fail)
    present, fresh, dead = conn.execute(st.finish(), params).fetchone()  # type: ignore[misc]  # a query that always returns one row
    return Counts(present, fresh, upserted, deleted, dead + refused, stale)


def _in_one_statement(
    conn: psycopg.Connection, st: Statements, params: dict[str, Any], deletes: bool, dead_letters: bool
) -> Counts | None:
    """The batch applied in one statement; None, and nothing applied, when it goes in rounds.

    It goes in rounds when a key has several events, and when the table refuses a row
    (rounds find it, to dead-letter it or, with on_error="fail", to say which). A batch
    without deletes is not asked first: its statement counts a key's events only when a
    record changed nothing, and a key met twice either does that or fails the statement.
    That saves grouping the whole batch by key, every batch.
    """
    if deletes and scalar(conn.execute(st.rounds(), params)) > 1:
        return None
    try:
        with conn.transaction() as savepoint:
            *counts, most = conn.execute(
                st.apply(deletes=deletes, dead_letters=dead_letters), params
            ).fetchone()  # type: ignore[misc]  # a query that always returns one row
            if most <= 1:
                return Counts(*counts)
            raise psycopg.Rollback(savepoint)
    except (*ROW_ERRORS, psycopg.errors.CardinalityViolation):
        pass  # a refused row, or a key whose second event met the row its first had written
    return None


def _apply_in_rounds(
    conn: psycopg.Connection, st: Statements, params: dict[str, Any], fail: bool
) -> tuple[int, int, int, int]:
    """Each key's events one after another: round r applies every key's r-th event.

    A round the table refuses is applied again in halves under savepoints until
    the refused rows are found and dead-lettered; the key's next event then
    meets the row as it was, as it would one event at a time.
    """
    conn.execute(st.materialize_rounds(), params)
    conn.execute(st.index_rounds())
    upserted = deleted = stale = refused = 0
    for round_, total in conn.execute(st.round_sizes()).fetchall():
        pending = [(1, total)]
        while pending:
            lo, hi = pending.pop()
            bounds = {**params, "round": round_, "lo": lo, "hi": hi}
            try:
                with conn.transaction():
                    u, d, s = conn.execute(st.apply_range(), bounds).fetchone()  # type: ignore[misc]  # a query that always returns one row
                upserted, deleted, stale = upserted + u, deleted + d, stale + s
            except ROW_ERRORS as exc:
                if fail:
                    raise error("SINK_ROW_REFUSED", sink=st.spec.name, reason=reason(exc)) from None
                if lo == hi:
                    row = {**params, "round": round_, "n": lo, "error": reason(exc)}
                    conn.execute(st.dead_letter_row(), row)
                    refused += 1
                else:
                    mid = (lo + hi) // 2
                    pending += [(mid + 1, hi), (lo, mid)]
    return upserted, deleted, stale, refused
