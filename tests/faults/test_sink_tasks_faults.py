"""The sink applying in the Spark tasks under failure: retried tasks, kill -9 of the driver and of
executors, a PostgreSQL restart mid-batch.

Every test checks row by row against the committed Kafka records: the table,
the ledger, one outbox event per change and no stray dead letter.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from outbox.core.config import DatabaseUrl
from outbox_dev.process import cmdline_contains, descendants, stop
from outbox_dev.spark import StandaloneCluster
from tests.helpers import (
    Job,
    OwnPostgres,
    create_topic,
    produce_transaction,
    reported,
    transactional_producer,
    unique,
    wait_for,
)
from tests.sink_support import (
    check_exactly_once,
    check_with_console,
    event,
    hold_partition_1,
    ledger,
    log_ends,
    partition_0_applied_1_waiting,
    produce_orders,
    produce_poison,
    table,
)

JOB = "tests/jobs/sink_tasks_job.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone cluster: a master and two one-core workers, each executor a JVM of its own."""
    started = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1)
    yield started
    started.stop()


def job(  # type: ignore[no-untyped-def]
    bootstrap: str, topic: str, url: DatabaseUrl, tmp: Path, run: str, mode: str, *extra: str, on=None
) -> Job:
    """The job, on `local[2,2]` or on the cluster `on`."""
    argv = [JOB, bootstrap, topic, url.raw, str(tmp / "checkpoint"), str(tmp / run), "400", mode, *extra]
    return Job(argv, tmp / f"{run}.log", {"SPARK_MASTER": on.url} if on else {})


def applied(output: str) -> list[tuple[int, int, int, int]]:
    """(batch, fresh, staged, retries) of each batch the job applied."""
    found = re.findall(r"applied (\d+): fresh (\d+) of (\d+) rows, (\d+) retries", output)
    return [tuple(map(int, f)) for f in found]  # type: ignore[misc]


@pytest.mark.parametrize("where", ["local", "cluster"])
def test_a_task_that_fails_after_its_commit_is_retried_and_applies_nothing_twice(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg, tmp_path, where, request
) -> None:
    on = request.getfixturevalue("cluster") if where == "cluster" else None
    expected = produce_orders(bootstrap, topic, 1500)
    dead = produce_poison(bootstrap, topic)

    retried = job(bootstrap, topic, db, tmp_path, "retried", "fail-after-commit", "available-now", on=on)
    assert retried.wait(300) == 0, retried.output()

    batches = applied(retried.output())
    assert len(batches) >= 3, retried.output()
    # Spark keeps each task's second attempt: it found every row applied by the first.
    assert all(fresh == 0 and staged > 0 for _, fresh, staged, _ in batches), batches
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)


@pytest.fixture
def blocker(db: DatabaseUrl) -> Iterator[psycopg.Connection]:
    """A session that can hold partition 1's ledger row, so that partition's task waits mid-batch."""
    with psycopg.connect(db.libpq) as conn:
        yield conn


def test_driver_killed_after_some_tasks_committed_then_restarted(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg, tmp_path, blocker
) -> None:
    dead = produce_poison(bootstrap, topic)  # first: in the batch that is cut short, then replayed
    expected = produce_orders(bootstrap, topic, 1500)
    hold_partition_1(blocker, topic)
    first = job(bootstrap, topic, db, tmp_path, "first", "plain")
    try:
        wait_for(lambda: partition_0_applied_1_waiting(pg), 180, "partition 0 committed, 1 waiting")
        # kill -9 of the driver's JVM alone: partition 1's Python worker lives on, blocked, as an orphan.
        java = [p for p in descendants(first.process.pid) if cmdline_contains(p, "SparkSubmit")]
        assert len(java) == 1
        stop(java[0], signal.SIGKILL)
        assert ledger(pg)[1] == 0 and 0 < len(table(pg)) < len(expected)
        blocker.rollback()  # the orphan may now commit its rows, racing the restarted job for them

        second = job(bootstrap, topic, db, tmp_path, "second", "plain", "available-now")
        assert second.wait(300) == 0, second.output()
    finally:
        first.kill9()
    assert applied(second.output())[0][0] == 0, "the killed batch was replayed"
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)


@pytest.mark.parametrize("fault", ["restart", "crash"])
def test_postgres_restarted_or_crashed_mid_batch(  # type: ignore[no-untyped-def]
    own_postgres: OwnPostgres, bootstrap, topic, tmp_path, fault: str
) -> None:
    """Partition 0's task has committed, partition 1's waits on a lock. restart: the waiting task's
    session ends with the others, and it starts over. crash: a server without fsync (or a failover
    to an asynchronous replica) loses partition 0's commit; partition 1's task then commits on the
    server that came back, and the driver recorded the batch after both: before 2026-11-27 the next
    batch found the record and went on, partition 0's rows of the batch gone for good, unsaid."""
    url = own_postgres.url
    expected = produce_orders(bootstrap, topic, 1500)
    dead = produce_poison(bootstrap, topic)
    ends = log_ends(bootstrap, topic)
    pg, blocker = psycopg.connect(url.libpq, autocommit=True), psycopg.connect(url.libpq)
    hold_partition_1(blocker, topic)
    if fault == "crash":
        own_postgres.execute("CHECKPOINT")
        own_postgres.pause_wal_writer()  # asynchronous commits from now on stay in memory
    streaming = job(bootstrap, topic, url, tmp_path, "streaming", "plain")
    try:
        try:
            wait_for(lambda: partition_0_applied_1_waiting(pg), 180, "partition 0 committed, 1 waiting")
            if fault == "restart":
                own_postgres.restart()
            else:
                own_postgres.crash()  # partition 0's commit, still in memory, is lost
                own_postgres.start()
        finally:
            pg.close()
            blocker.close()
        with psycopg.connect(url.libpq, autocommit=True) as pg:
            wait_for(lambda: ledger(pg) == ends, 240, f"every partition applied after the {fault}")
            check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    finally:
        streaming.kill9()
    first_batch = applied(streaming.output())[0]
    assert first_batch[0] == 0
    if fault == "restart":
        assert first_batch[3] >= 1, "the waiting task started over after the restart"


def test_on_a_cluster_an_executor_killed_mid_batch(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg, tmp_path, blocker, cluster
) -> None:
    """kill -9 of the executor whose task is mid-transaction: Spark runs the task elsewhere, and
    the killed executor's Python worker, orphaned, may still commit: the ledger lets one of them apply."""
    dead = produce_poison(bootstrap, topic)  # first: in the batch that is cut short, then replayed
    expected = produce_orders(bootstrap, topic, 1500)
    hold_partition_1(blocker, topic)
    streaming = job(bootstrap, topic, db, tmp_path, "cluster", "plain", "available-now", on=cluster)
    try:
        wait_for(lambda: partition_0_applied_1_waiting(pg), 240, "partition 0 committed, 1 waiting")
        name = pg.execute("SELECT application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        worker = int(re.fullmatch(r"outbox-sink task, pid (\d+)", name.fetchone()[0])[1])  # type: ignore[index]
        executor = next(e for e in cluster.executors() if worker in descendants(e))
        stop(executor, signal.SIGKILL)
        blocker.rollback()
        assert streaming.wait(300) == 0, streaming.output()
    finally:
        streaming.kill9()
    assert executor not in cluster.executors()
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)


def test_on_a_cluster_an_executor_killed_after_its_task_committed(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg, tmp_path, cluster
) -> None:
    """kill -9 of the executor whose task has committed but not yet reported: Spark runs the
    task again on another executor, which finds its rows applied."""
    dead = produce_poison(bootstrap, topic)  # first: in the batch whose task runs twice
    expected = produce_orders(bootstrap, topic, 1500)
    mode = "pause-after-commit"
    streaming = job(bootstrap, topic, db, tmp_path, "cluster", mode, "available-now", on=cluster)
    try:
        paused = tmp_path / "cluster" / "paused"
        wait_for(paused.exists, 240, "partition 1's task committed and paused")
        worker = int(paused.read_text())
        executor = next(e for e in cluster.executors() if worker in descendants(e))
        stop(executor, signal.SIGKILL)
        assert streaming.wait(300) == 0, streaming.output()
    finally:
        streaming.kill9()
    first = applied(streaming.output())[0]
    assert first[0] == 0 and first[1] < first[2], "the task run again found its rows applied"
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)


class Orders:
    """New orders, a transaction of 50 every half second until stopped, by a thread of its own;
    each transaction into the next of the topic's `partitions` (raised when the topic grows).
    Each also edits 10 orders of earlier transactions, once each: an order applied twice comes
    back as it was before its edit, or with an outbox event too many."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.expected: dict[str, tuple] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            producer, known = transactional_producer(self.bootstrap), 0
            unedited: dict[int, list[str]] = {}
            for sent in itertools.count():
                if self.stop.wait(0.5):
                    return
                while known < self.partitions:  # the producer learns of the new partitions first
                    known = len(producer.list_topics(self.topic, timeout=10).topics[self.topic].partitions)
                ids, partition = [str(uuid.uuid4()) for _ in range(50)], sent % self.partitions
                mine = unedited.setdefault(partition, [])  # an edit follows its order in its partition
                edits, mine[:10] = mine[:10], []
                records = [event(i, n) for n, i in enumerate(ids)]
                records += [event(i, self.expected[i][0], "9.99") for i in edits]
                produce_transaction(producer, self.topic, records, partition=partition)
                self.expected.update({i: (n, Decimal("1.00"), None) for n, i in enumerate(ids)})
                self.expected.update({i: (self.expected[i][0], Decimal("9.99"), None) for i in edits})
                mine += ids
        except BaseException as exc:  # raised again by join()
            self.error = exc

    error: BaseException | None = None

    def join(self) -> dict[str, tuple]:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, self.error
        return self.expected


@pytest.mark.parametrize(
    "seconds",
    [45, pytest.param(600, marks=[pytest.mark.soak, pytest.mark.timeout(1800)])],
    ids=["45s", "600s"],
)
def test_an_executor_storm_with_speculation_while_the_topic_gains_partitions(  # type: ignore[no-untyped-def]
    bootstrap, db, pg, tmp_path, cluster, seconds
) -> None:
    """On the standalone cluster, speculation on: an executor killed -9 every 3-8 s (its worker
    starts another) while orders keep coming, and the topic grows from 2 partitions to 4 halfway,
    orders written into the new ones while the driver is frozen. A query that fails for it (too
    many task failures) is started again from its checkpoint, as a supervisor would. The long form
    (`make soak`) also kills the driver -9 every 90 s or so and starts it again. Then every
    order once, the ledger at the log's end of all 4 partitions. Seen to catch a source that starts
    a partition it finds at its end: the table came out right (each skipped order was edited later,
    and an edit carries the whole order), and the outbox held fewer events than changes."""
    topic = create_topic(bootstrap, unique("orders"), partitions=2)
    orders = Orders(bootstrap, topic, 2)
    env = {"SPARK_MASTER": cluster.url, "SPARK_SPECULATION": "1"}
    argv = [JOB, bootstrap, topic, db.raw, str(tmp_path / "checkpoint")]

    def run(n: int) -> Job:
        return Job([*argv, str(tmp_path / f"run{n}"), "400", "plain"], tmp_path / f"run{n}.log", env)

    runs = [run(0)]
    kills, driver_kills, rng = 0, 0, random.Random(seconds)
    driver_every = 90 if seconds > 60 else None  # the soak's kill -9s of the driver, mixed in
    try:
        runs[-1].wait_for_output("applied 0", 240)
        began = last_driver_kill = time.monotonic()
        grown = False
        while time.monotonic() - began < seconds:
            time.sleep(rng.uniform(3, 8))
            if driver_every and time.monotonic() - last_driver_kill > driver_every:
                runs[-1].kill9()  # the driver, mid-batch or between: its checkpoint goes on
                driver_kills, last_driver_kill = driver_kills + 1, time.monotonic()
                runs.append(run(len(runs)))
                continue
            if not grown and time.monotonic() - began > seconds / 2 and runs[-1].process.poll() is None:
                # The driver frozen while the topic grows and orders go into the new partitions: it
                # finds them with records it must read from their start.
                os.killpg(runs[-1].process.pid, signal.SIGSTOP)
                try:
                    admin = AdminClient({"bootstrap.servers": bootstrap})
                    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
                    orders.partitions, grown = 4, True
                    wait_for(lambda: len(log_ends(bootstrap, topic, 4)) == 4, 60, "orders in all 4")
                finally:
                    os.killpg(runs[-1].process.pid, signal.SIGCONT)
            if runs[-1].process.poll() is not None:
                runs.append(run(len(runs)))  # the query failed under the storm: its checkpoint goes on
                continue
            executors = cluster.executors()
            if executors:
                stop(rng.choice(executors), signal.SIGKILL)
                kills += 1
        expected = orders.join()
        if runs[-1].process.poll() is not None:
            runs.append(run(len(runs)))
        ends = log_ends(bootstrap, topic, 4)
        wait_for(lambda: ledger(pg) == ends, 300, "the ledger at the log's end")
        assert grown and len(ends) == 4, ends
    finally:
        orders.stop.set()
        for job_ in runs:
            job_.kill9()
    reported(
        f"executor storm, {seconds} s: {kills} executors and {driver_kills} drivers killed -9,"
        f" {len(runs) - 1 - driver_kills} query restarts",
        f"{len(expected):6d} orders",
    )
    check_exactly_once(pg, bootstrap, topic, expected, partitions=4)
    check_with_console(pg, bootstrap, topic)  # a second reader: Kafka's own, read_committed
