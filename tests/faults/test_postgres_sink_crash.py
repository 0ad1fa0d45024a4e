"""kill -9 of a sink job at chosen and random points, then a restart: every event applied once."""

from __future__ import annotations

import random
import signal
import time

import pytest

from outbox_dev.kafka import Broker
from tests.helpers import create_topic, unique
from tests.sink_support import check_exactly_once, ledger, log_ends, produce_orders, sink_job, table


def test_kill9_after_executors_staged_then_restart(bootstrap, topic, db, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    expected = produce_orders(bootstrap, topic, 1500)

    first = sink_job(bootstrap, topic, db, tmp_path, "first", 2)
    first.wait_for_output("staged 2", timeout=180)
    first.kill9()
    # The executors committed batch 2's rows to the stage table; none of them reached the table or ledger.
    staged = pg.execute(
        "SELECT count(*) FROM pg_class WHERE relname LIKE 'sink_stage_%' AND relpersistence = 'u'"
    ).fetchone()
    assert staged == (1,)
    assert 0 < len(table(pg)) < len(expected)
    before = ledger(pg)

    second = sink_job(bootstrap, topic, db, tmp_path, "second", -1, "available-now")
    assert second.wait(300) == 0, second.output()

    assert "applied 2" in second.output()  # the killed batch was replayed, not skipped
    assert all(before[p] <= offset for p, offset in ledger(pg).items())
    check_exactly_once(pg, bootstrap, topic, expected)


@pytest.mark.soak  # kills at chosen points are in `make test` (above, and test_sink_tasks_faults.py)
def test_kill9_at_random_points_then_restart(bootstrap, topic, db, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    expected: dict[str, tuple] = {}
    delays = [random.uniform(0.0, 3.0) for _ in range(3)]
    for run, delay in enumerate(delays):
        # New events before each run, so each has batches left to apply and be killed in
        # (with all events written up front, two quick runs could finish them all).
        expected.update(produce_orders(bootstrap, topic, 700))
        victim = sink_job(bootstrap, topic, db, tmp_path, f"run{run}", -1)
        victim.wait_for_output("applied", timeout=180)  # then somewhere in a later batch's stage or apply
        time.sleep(delay)
        victim.kill9()

    last = sink_job(bootstrap, topic, db, tmp_path, "last", -1, "available-now")
    assert last.wait(300) == 0, f"kills after {delays}: {last.output()}"
    check_exactly_once(pg, bootstrap, topic, expected)


def test_broker_killed_mid_stream_then_restarted(own_broker: Broker, db, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """kill -9 of the broker under a running query: it rides the outage out, or fails and resumes."""
    bootstrap = own_broker.bootstrap
    topic = create_topic(bootstrap, unique("orders"), partitions=2)
    expected = produce_orders(bootstrap, topic, 1500)
    streaming = sink_job(bootstrap, topic, db, tmp_path, "streaming", -1)
    streaming.wait_for_output("applied 1", timeout=180)
    own_broker.restart(signal.SIGKILL)
    expected.update(produce_orders(bootstrap, topic, 700))
    ends = log_ends(bootstrap, topic)

    deadline = time.monotonic() + 240
    while streaming.process.poll() is None and ledger(pg) != ends and time.monotonic() < deadline:
        time.sleep(1)
    if streaming.process.poll() is None:
        streaming.kill9()  # it rode the outage out (or hangs: the checks below say which)
    else:  # it failed on the outage: a restart from its checkpoint finishes the topic
        resumed = sink_job(bootstrap, topic, db, tmp_path, "resumed", -1, "available-now")
        assert resumed.wait(300) == 0, resumed.output()
    check_exactly_once(pg, bootstrap, topic, expected)


def test_kill9_after_evolve_added_a_column_and_before_its_rows_then_restart(
    bootstrap, topic, db, pg, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """The column is added when the writer is made and commits on its own; the job killed before
    batch 0 applies leaves it with no rows, and the replay writes them, each once."""
    pg.execute("ALTER TABLE orders DROP COLUMN amount")
    expected = produce_orders(bootstrap, topic, 900)

    first = sink_job(bootstrap, topic, db, tmp_path, "first", 0, "evolve")
    first.wait_for_output("staged 0", timeout=180)
    first.kill9()
    added = pg.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'orders'::regclass"
        " AND attname = 'amount' AND NOT attisdropped"
    ).fetchall()
    assert added == [("numeric(12,2)",)]
    assert table(pg) == {} and ledger(pg) == {}

    second = sink_job(bootstrap, topic, db, tmp_path, "second", -1, "available-now", "evolve")
    assert second.wait(300) == 0, second.output()
    assert "applied 0" in second.output()
    check_exactly_once(pg, bootstrap, topic, expected)
