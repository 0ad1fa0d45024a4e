"""A task's own decisions, alone: the topic-partitions it holds, whether keys repeat, when to start over."""

from __future__ import annotations

import functools
import time

import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.postgres import retry
from sinks.postgres.retry import WORKER_LATE, with_retries
from sinks.postgres.task import NOTHING, Outcome, firsts, past_ledger

row = st.tuples(
    st.sampled_from(["a", "b", None]),
    st.integers(0, 3),
    st.sampled_from(["t1", "t2"]),
    st.integers(0, 9) | st.none(),  # a frame not from Kafka may have rows without an offset
)
rows = st.lists(row)


def table(picked: list[tuple]) -> pa.Table:
    keys, partitions, topics, offsets = zip(*picked, strict=True) if picked else ((), (), (), ())
    return pa.table(
        {
            "c0": pa.array(keys, pa.string()),
            "c1": pa.array(partitions, pa.int64()),
            "_topic": pa.array(topics, pa.string()),
            "_partition": pa.array(partitions, pa.int32()),
            "_offset": pa.array(offsets, pa.int64()),
        }
    )


@settings(deadline=None)  # the first group_by loads Arrow's compute kernels
@given(rows.filter(bool))
def test_the_topic_partitions_held_are_each_pair_once_with_its_first_offset(picked: list[tuple]) -> None:
    def first(offsets: list[int | None]) -> int | None:
        return None if None in offsets else min(o for o in offsets if o is not None)

    held = firsts(table(picked))
    assert held == {(t, p): first([o for _, q, u, o in picked if (u, q) == (t, p)]) for _, p, t, _ in picked}


@settings(deadline=None)
@given(
    rows.filter(bool),
    st.dictionaries(st.tuples(st.sampled_from(["t1", "t2"]), st.integers(0, 3)), st.integers(0, 10)),
)
def test_a_stage_is_past_the_ledger_only_when_no_row_is_below_its_partitions_next_offset(
    picked: list[tuple], ledger: dict[tuple[str, int], int]
) -> None:
    """A row the ledger has applied, in any partition, or a row without an offset, sends the stage
    through the ledger."""
    applied = [o is None or o < ledger.get((t, p), 0) for _, p, t, o in picked]
    assert past_ledger(firsts(table(picked)), ledger) == (not any(applied))


def test_errors_of_the_moment_start_over_and_are_counted_and_others_are_not() -> None:
    tries = iter([psycopg.errors.DeadlockDetected(), psycopg.OperationalError("server closed"), NOTHING])

    def attempt() -> Outcome:
        step = next(tries)
        if isinstance(step, Exception):
            raise step
        return step

    assert with_retries(attempt, 10, "a task") == (NOTHING, 2)

    def refused() -> Outcome:
        raise psycopg.errors.CheckViolation("no")

    with pytest.raises(psycopg.errors.CheckViolation):
        with_retries(refused, 10, "a task")


def test_starting_over_stops_at_the_budget() -> None:
    calls = []

    def down() -> Outcome:
        calls.append(1)
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(psycopg.OperationalError):
        with_retries(down, 0.5, "a task")
    assert 2 <= len(calls) <= 5


def test_the_budget_counts_from_the_first_failure_not_from_the_first_attempts_start() -> None:
    """A batch whose tasks ran longer than the budget, then lost the server at its end, failed the
    query at once: its budget was spent before the trouble began."""
    tries = iter(["long", "lost", "done"])

    def attempt() -> str:
        step = next(tries)
        if step == "long":
            time.sleep(0.6)  # longer than the whole budget, and yet it fails only now
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        if step == "lost":
            raise psycopg.OperationalError("connection refused")
        return step

    assert with_retries(attempt, 0.5, "a batch") == ("done", 2)


def test_a_query_starts_again_only_when_the_servers_python_process_was_late() -> None:
    """Spark Connect's error as its client raises it, with Spark's cause on its last line."""
    late = RuntimeError(f"[STREAMING_PYTHON_RUNNER_INITIALIZATION_FAILURE] ...\nCaused by: {WORKER_LATE}")
    outcomes: list[Exception | str] = [late, late, "query"]
    start_query = functools.partial(retry.start_query, attempts=3, pause=0.0)
    calls: list[Exception | str] = []

    def start() -> str:
        calls.append(step := outcomes[len(calls)] if len(calls) < len(outcomes) else late)
        if isinstance(step, Exception):
            raise step
        return step

    assert start_query(start, "sink s") == "query" and len(calls) == 3
    calls.clear()
    outcomes[2] = late
    with pytest.raises(RuntimeError, match="Caused by"):  # late three times: Spark's error, as it was
        start_query(start, "sink s")
    assert len(calls) == 3

    calls.clear()
    outcomes[0] = ValueError("[STREAM_FAILED] no such column")
    with pytest.raises(ValueError):  # any other error is the user's to read, at once
        start_query(start, "sink s")
    assert len(calls) == 1
