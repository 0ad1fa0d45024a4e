"""kill -9 of a routed sink's job mid-batch, then a restart: three tables, one ledger, every
committed event applied once, checked by each table's fold and by `outbox verify`."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from tests.helpers import Job, create_topic, unique, wait_for
from tests.routing_support import TABLES, check_routed, produce_shop
from tests.sink_support import waiting_on_a_lock

pytestmark = pytest.mark.timeout(600)
JOB = "tests/jobs/routed_job.py"


def job(bootstrap: str, topic: str, url: DatabaseUrl, tmp: Path, run: str, mode: str, *extra: str) -> Job:
    argv = [JOB, bootstrap, topic, url.raw, str(tmp / "checkpoint"), str(tmp / run), mode, *extra]
    return Job(argv, tmp / f"{run}.log", {})


@pytest.fixture
def shop_topic(bootstrap: str) -> str:
    return create_topic(bootstrap, unique("shop"), partitions=2)


def test_killed_after_one_task_committed_its_tables_and_another_holds_its_rows(  # type: ignore[no-untyped-def]
    bootstrap, shop_topic, outbox_db, pg, tmp_path
) -> None:
    """Partition 0's task commits its three tables and the ledger; partition 1's task has staged
    its lanes and waits for its ledger row, which a session holds. kill -9 of the job, then the
    row freed (the orphaned task may commit, racing the restart) and the job run again."""
    pg.execute(TABLES)
    strays = produce_shop(bootstrap, shop_topic, 100)
    with psycopg.connect(outbox_db.libpq) as blocker:
        blocker.execute(
            "INSERT INTO sink_progress (sink, topic, kafka_partition, next_offset) VALUES ('shop', %s, 1, 0)",
            [shop_topic],
        )
        blocker.commit()
        blocker.execute("SELECT 1 FROM sink_progress WHERE kafka_partition = 1 FOR UPDATE")
        first = job(bootstrap, shop_topic, outbox_db, tmp_path, "first", "tasks")
        try:

            def held() -> bool:
                ledger = dict(pg.execute("SELECT kafka_partition, next_offset FROM sink_progress").fetchall())
                return ledger.get(0, 0) > 0 and waiting_on_a_lock(pg) == 1

            wait_for(held, 180, "partition 0 committed, partition 1 waiting")
            taken = [
                pg.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("orders", "payments", "order_lines")
            ]  # type: ignore[index]
            assert all(n > 0 for n in taken), taken  # every table holds partition 0's rows
            first.kill9()
        finally:
            first.kill9()
    second = job(bootstrap, shop_topic, outbox_db, tmp_path, "second", "tasks", "available-now")
    assert second.wait(300) == 0, second.output()
    check_routed(pg, bootstrap, shop_topic, outbox_db.raw, strays)


def test_killed_after_the_driver_staged_a_batch_then_restarted(
    bootstrap, shop_topic, outbox_db, pg, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    pg.execute(TABLES)
    strays = produce_shop(bootstrap, shop_topic, 100)
    first = job(bootstrap, shop_topic, outbox_db, tmp_path, "first", "driver-1")
    try:
        first.wait_for_output("staged 1", timeout=180)
        staged = pg.execute(
            "SELECT count(*) FROM pg_class WHERE relname LIKE 'sink_stage_%' AND relpersistence = 'u'"
        ).fetchone()
        assert staged == (3,)  # a stage per table
    finally:
        first.kill9()
    second = job(bootstrap, shop_topic, outbox_db, tmp_path, "second", "driver--1", "available-now")
    assert second.wait(300) == 0, second.output()
    assert "applied 1" in second.output()  # the killed batch was replayed, not skipped
    check_routed(pg, bootstrap, shop_topic, outbox_db.raw, strays)
