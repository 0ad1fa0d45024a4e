"""The sink when PostgreSQL goes back in time after Spark's checkpoint moved on.

A crash of a server without fsync, a failover to an asynchronous replica or a
restore can lose a batch's commits after Spark recorded the batch as done.
Spark would go on from its checkpoint and the table would lack those events
for good (issue 25, case 10). The next batch must say so, apply nothing, and
name what reads them again; that remedy must then leave the table whole.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from pyspark.errors import StreamingQueryException

from sinks.postgres import PostgresSink
from tests.helpers import OwnPostgres, produce_transaction, transactional_producer, wait_for
from tests.sink_support import event, ledger, log_ends, run, table


def orders(bootstrap: str, topic: str, count: int) -> dict[str, tuple]:
    """`count` new orders in one committed transaction, on partition 0."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    produce_transaction(
        transactional_producer(bootstrap), topic, [event(i, n) for n, i in enumerate(ids)], partition=0
    )
    return {i: (n, Decimal("1.00"), None) for n, i in enumerate(ids)}


def lose_what_follows(server: OwnPostgres, how: str, backup: Path) -> Callable[[], OwnPostgres]:
    """Arrange for the commits made from now on to be lost; the returned step loses them.

    crash: the WAL writer is paused, so asynchronous commits stay in memory and a
    crash takes them (the driver path commits its batch synchronously, as it
    drops the stage table). restore: a base backup taken now comes back.
    """
    if how == "crash":
        server.pause_wal_writer()
    else:
        server.copy(backup, standby=False)

    def lose() -> OwnPostgres:
        server.crash()
        if how == "crash":
            server.start()
            return server
        return OwnPostgres(backup, port=server.port)

    return lose


@pytest.mark.parametrize(
    ("tasks", "how"), [(True, "crash"), (False, "restore")], ids=["in-tasks-crash", "on-driver-restore"]
)
def test_batches_postgres_lost_after_the_checkpoint_moved_on_fail_the_next_and_are_read_again(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, own_postgres: OwnPostgres, tmp_path: Path, tasks: bool, how: str
) -> None:
    url = own_postgres.url.raw
    options = {"ledger.sink": "orders", "ledger.url": url}
    if not tasks:
        options["minPartitions"] = "4"  # a split partition is applied on the driver

    def sink_run(checkpoint: Path) -> PostgresSink:
        sink = PostgresSink("orders", url=url, name="orders")
        return run(spark, bootstrap, topic, checkpoint, sink, tasks=tasks, **options)

    def rows() -> dict[str, tuple]:
        with psycopg.connect(url, autocommit=True) as pg:
            return table(pg)

    expected = orders(bootstrap, topic, 50)
    sink_run(tmp_path / "checkpoint")  # batch 0
    own_postgres.execute("CHECKPOINT")  # batch 0 is on disk for good

    lose = lose_what_follows(own_postgres, how, tmp_path / "backup")
    expected |= orders(bootstrap, topic, 40)
    sink_run(tmp_path / "checkpoint")  # batch 1: applied, and recorded by Spark's checkpoint
    server = lose()
    try:
        assert len(rows()) == 50, "batch 1 was to be lost"

        expected |= orders(bootstrap, topic, 30)
        with pytest.raises(
            StreamingQueryException,
            match=r"\[SINK_BATCH_LOST\] sink orders: PostgreSQL no longer holds batch 1,",
        ) as info:
            sink_run(tmp_path / "checkpoint")  # batch 2
        assert "nothing of batch 2 was applied" in str(info.value)
        # The ledger stands after batch 0: its 50 records, offsets 0-49.
        assert f'startingOffsets=\'{{"{topic}":{{"0":50}}}}\'' in str(info.value)
        assert len(rows()) == 50

        sink_run(tmp_path / "new-checkpoint")  # the remedy the error names
        assert rows() == expected
        with psycopg.connect(url, autocommit=True) as pg:
            assert ledger(pg) == {0: log_ends(bootstrap, topic)[0]}
    finally:
        if server is not own_postgres:
            server.stop()


def test_a_batch_lost_while_the_next_ones_tasks_wait_is_said_and_read_again(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, own_postgres: OwnPostgres, tmp_path: Path
) -> None:
    """PostgreSQL goes back in time after the driver checked the batch before this one, and before
    this batch's tasks commit (here they wait on a lock). The tasks started over on the server that
    came back, moved the ledger on from where it then stood, and the batch was recorded: the lost
    batch's events were never applied, and nothing said so."""
    url = own_postgres.url.raw
    options = {"ledger.sink": "orders", "ledger.url": url}

    def sink_run(checkpoint: Path) -> PostgresSink:
        sink = PostgresSink("orders", url=url, name="orders")
        return run(spark, bootstrap, topic, checkpoint, sink, **options)

    expected = orders(bootstrap, topic, 50)
    sink_run(tmp_path / "checkpoint")  # batch 0
    own_postgres.execute("CHECKPOINT")
    own_postgres.pause_wal_writer()  # what commits from now on stays in memory, for the crash to take
    expected |= orders(bootstrap, topic, 40)
    sink_run(tmp_path / "checkpoint")  # batch 1: applied, and recorded by Spark's checkpoint
    expected |= orders(bootstrap, topic, 30)
    holder = psycopg.connect(url)
    holder.execute("SELECT FROM sink_progress WHERE sink = 'orders' FOR UPDATE")  # batch 2's task waits
    failed: list[BaseException] = []

    def batch_2() -> None:
        try:
            sink_run(tmp_path / "checkpoint")
        except BaseException as exc:  # the test's thread: said below
            failed.append(exc)

    thread = threading.Thread(target=batch_2)
    thread.start()
    waiting = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND starts_with(application_name, 'outbox-sink task')"
    )
    wait_for(
        lambda: own_postgres.execute(waiting) == [(1,)], 120, "batch 2's task waiting, its batch checked"
    )
    own_postgres.crash()  # batch 1 is lost
    holder.close()
    own_postgres.start()
    thread.join(300)
    assert not thread.is_alive()
    assert failed and isinstance(failed[0], StreamingQueryException), failed
    assert "[SINK_BATCH_LOST] sink orders: PostgreSQL no longer holds batch 1," in str(failed[0])
    with psycopg.connect(url, autocommit=True) as pg:
        assert len(table(pg)) == 50, "nothing of batch 2 was to be applied"
    sink_run(tmp_path / "new-checkpoint")  # the remedy the error names
    with psycopg.connect(url, autocommit=True) as pg:
        assert table(pg) == expected
        assert ledger(pg) == {0: log_ends(bootstrap, topic)[0]}


@pytest.mark.parametrize("start", ["ledger", "earliest"])
def test_a_new_querys_batch_lost_to_a_restore_fails_its_next_batch(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, own_postgres: OwnPostgres, tmp_path: Path, start: str
) -> None:
    """Query A applies; query B, on a new checkpoint (the remedy SINK_BATCH_LOST names), applies its
    batch 0; a restore takes PostgreSQL back to A's last batch. B's batch 1 must stop: before, it
    went on, and batch 0's events were never read again (80 rows of 120; issue 60, item 4)."""
    url = own_postgres.url.raw
    from_ledger = {"ledger.sink": "orders", "ledger.url": url}

    def sink_run(checkpoint: Path, **options: str) -> PostgresSink:
        sink = PostgresSink("orders", url=url, name="orders")
        return run(spark, bootstrap, topic, checkpoint, sink, **options)

    def rows() -> dict[str, tuple]:
        with psycopg.connect(url, autocommit=True) as pg:
            return table(pg)

    expected = orders(bootstrap, topic, 50)
    sink_run(tmp_path / "a")
    own_postgres.execute("CHECKPOINT")
    lose = lose_what_follows(own_postgres, "restore", tmp_path / "backup")
    expected |= orders(bootstrap, topic, 40)
    b = from_ledger if start == "ledger" else {}  # else from earliest: the ledger skips A's events
    sink_run(tmp_path / "b", **b)  # B's batch 0
    server = lose()
    try:
        assert len(rows()) == 50, "B's batch 0 was to be lost"
        expected |= orders(bootstrap, topic, 30)
        with pytest.raises(
            StreamingQueryException,
            match=r"\[SINK_BATCH_LOST\] sink orders: PostgreSQL no longer holds batch 0 of this query",
        ) as info:
            sink_run(tmp_path / "b", **b)  # B's batch 1
        assert f'startingOffsets=\'{{"{topic}":{{"0":50}}}}\'' in str(info.value)
        assert len(rows()) == 50
        sink_run(tmp_path / "c", **from_ledger)  # the remedy the error names
        assert rows() == expected
    finally:
        if server is not own_postgres:
            server.stop()
