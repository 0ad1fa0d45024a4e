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

from dataclasses import dataclass, field
from typing import Any

import psycopg

from sinks.postgres.refusal import ROW_ERRORS, SinkError, reason
from sinks.postgres.statements import Statements


@dataclass(frozen=True)
class BatchResult:
    batch_id: int
    staged: int  # rows the executors staged
    fresh: int  # of those, not applied before (the rest were replays)
    upserted: int
    deleted: int
    dead: int  # dead-lettered
    retries: int = 0  # task transactions started over (lost connection, deadlock)
    stage_seconds: float = 0.0  # in the tasks: the slowest task's COPY; on the driver: the stage job
    apply_seconds: float = 0.0  # in the tasks: the slowest task's apply and commit
    # In the tasks: seconds per stage (sinks.postgres.clock), summed over the batch's tasks.
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def replayed(self) -> int:
        return self.staged - self.fresh

    def __str__(self) -> str:
        again = f", {self.retries} task transactions started over" if self.retries else ""
        return (
            f"batch {self.batch_id}: {self.staged} rows, {self.upserted} upserted, {self.deleted} deleted,"
            f" {self.dead} dead letters, {self.replayed} already applied{again}"
            f" (stage {self.stage_seconds:.2f}s, apply {self.apply_seconds:.2f}s)"
        )


def apply_batch(
    conn: psycopg.Connection,
    st: Statements,
    batch_id: int,
    attempts: list[int],
    staged: int,
    record: dict[str, Any] | None = None,
) -> BatchResult:
    """record: the parameters of `st.record_batch()`, committed with the batch (continuity.py)."""
    params: dict[str, Any] = {"sink": st.spec.name, "attempts": attempts}
    with conn.transaction():
        present, fresh, upserted, deleted, dead = apply_rows(conn, st, params)
        if present != staged:  # raising here rolls the whole batch back
            raise SinkError(
                f"sink {st.spec.name}: the stage table holds {present} of {staged} staged rows (was"
                " PostgreSQL restarted?); nothing was applied, the batch replays when the query restarts"
            )
        conn.execute(st.drop_stage())
        if record:
            conn.execute(st.record_batch(), record)
    return BatchResult(batch_id, staged, fresh, upserted, deleted, dead)


Counts = tuple[int, int, int, int, int]  # present, fresh, upserted, deleted, dead


def apply_rows(conn: psycopg.Connection, st: Statements, params: dict[str, Any]) -> Counts:
    """Apply the staged rows of `params["attempts"]` inside the open transaction, ledger included.

    Whether a key has two rows is asked of PostgreSQL, on the staged rows in the
    table's own types: keys that differ as text may be one value there (a uuid in
    upper and lower case, citext, '1' and '01' into a number).
    """
    fail = st.spec.on_error == "fail"
    # Enough memory to number a batch's events in one in-memory sort, not in temp files.
    conn.execute("SET LOCAL work_mem = '256MB'")
    if fail and (bad := conn.execute(st.first_error(), params).fetchone()):
        raise SinkError(f"sink {st.spec.name}: cannot write {bad[0]}[{bad[1]}]@{bad[2]}: {bad[3]}")
    if conn.execute(st.rounds(), params).fetchone()[0] <= 1:  # type: ignore[index]
        try:
            with conn.transaction():
                return conn.execute(st.apply(), params).fetchone()  # type: ignore[return-value]
        except ROW_ERRORS as exc:
            if fail:
                raise SinkError(f"sink {st.spec.name}: the table refused a row: {reason(exc)}") from None
    upserted, deleted, refused = _apply_in_rounds(conn, st, params, fail)
    present, fresh, dead = conn.execute(st.finish(), params).fetchone()  # type: ignore[misc]
    return present, fresh, upserted, deleted, dead + refused


def _apply_in_rounds(
    conn: psycopg.Connection, st: Statements, params: dict[str, Any], fail: bool
) -> tuple[int, int, int]:
    """Each key's events one after another: round r applies every key's r-th event.

    A round the table refuses is applied again in halves under savepoints until
    the refused rows are found and dead-lettered; the key's next event then
    meets the row as it was, as it would one event at a time.
    """
    conn.execute(st.materialize_rounds(), params)
    conn.execute(st.index_rounds())
    upserted = deleted = refused = 0
    for round_, total in conn.execute(st.round_sizes()).fetchall():
        pending = [(1, total)]
        while pending:
            lo, hi = pending.pop()
            bounds = {**params, "round": round_, "lo": lo, "hi": hi}
            try:
                with conn.transaction():
                    u, d = conn.execute(st.apply_range(), bounds).fetchone()  # type: ignore[misc]
                upserted, deleted = upserted + u, deleted + d
            except ROW_ERRORS as exc:
                if fail:
                    raise SinkError(f"sink {st.spec.name}: the table refused a row: {reason(exc)}") from None
                if lo == hi:
                    row = {**params, "round": round_, "n": lo, "error": reason(exc)}
                    conn.execute(st.dead_letter_row(), row)
                    refused += 1
                else:
                    mid = (lo + hi) // 2
                    pending += [(mid + 1, hi), (lo, mid)]
    return upserted, deleted, refused
