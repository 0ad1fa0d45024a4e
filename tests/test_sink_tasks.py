"""The sink applying in the Spark tasks: split frames, duplicate and retried attempts, kills, restarts.

Every test checks row by row against the committed Kafka records: the table,
the ledger, one outbox event per change and no stray dead letter.
"""

from __future__ import annotations

import random
import re
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import functions as F

from core.config import DatabaseUrl
from core.errors import ConfigError
from outbox import migrate
from outbox.dev.process import cmdline_contains, descendants, stop
from outbox.dev.spark import StandaloneCluster
from sinks.postgres import Outbox, PostgresSink, SinkError, parse_json
from tests.helpers import (
    Job,
    create_topic,
    produce_transaction,
    transactional_producer,
    unique,
    wait_for,
)
from tests.sink_support import (
    ORDERS,
    SCHEMA,
    check_exactly_once,
    event,
    ledger,
    log_ends,
    produce_orders,
    table,
)

JOB = "tests/jobs/sink_tasks_job.py"
OUTBOX = Outbox(topic="out", key="written.event_id::text")


def sink(url: DatabaseUrl, **options) -> PostgresSink:  # type: ignore[no-untyped-def]
    return PostgresSink("orders", url=url.raw, outbox=OUTBOX, **options)


def kafka_rc(spark, bootstrap: str, topic: str, **options: str):  # type: ignore[no-untyped-def]
    raw = (
        spark.readStream.format("kafka_rc")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
    )
    return parse_json(raw, SCHEMA, key_column="event_id")


# -- frames that may split a topic-partition: applied on the driver, correct; refused with apply_in='tasks'


def split_frames(spark, bootstrap: str, topic: str, other: str):  # type: ignore[no-untyped-def]
    events = kafka_rc(spark, bootstrap, topic, maxOffsetsPerTrigger="400")
    every_n = spark.range(0, 100_000).select(F.col("id").alias("n"))
    return {
        "minPartitions": kafka_rc(spark, bootstrap, topic, maxOffsetsPerTrigger="400", minPartitions="6"),
        "repartition": events.repartition(3),
        "union": events.unionByName(kafka_rc(spark, bootstrap, other, maxOffsetsPerTrigger="400")),
        "join": events.join(every_n, "n", "left_semi"),
    }


@pytest.mark.parametrize("shape", ["minPartitions", "repartition", "union", "join"])
def test_a_frame_that_may_split_a_topic_partition_is_applied_on_the_driver_or_refused(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, checkpoint, shape
) -> None:
    other = create_topic(bootstrap, unique("other"), partitions=2)
    expected = produce_orders(bootstrap, topic, 900)
    if shape == "union":
        expected |= produce_orders(bootstrap, other, 600)
    frame = split_frames(spark, bootstrap, topic, other)[shape]

    with pytest.raises(ConfigError, match="apply_in='tasks' needs each topic-partition's rows"):
        sink(db, apply_in="tasks").writer(frame)
    auto = sink(db)
    query = auto.start(frame, str(checkpoint), trigger={"availableNow": True})
    assert auto.route is not None and not auto.route.tasks, auto.route
    query.awaitTermination()

    assert table(pg) == expected
    ends = {(topic, p): o for p, o in log_ends(bootstrap, topic).items()}
    if shape == "union":
        ends |= {(other, p): o for p, o in log_ends(bootstrap, other).items()}
    progress = pg.execute("SELECT topic, kafka_partition, next_offset FROM sink_progress")
    assert {(t, p): o for t, p, o in progress} == ends
    edits = sum(1 for v in expected.values() if v[1] == Decimal("9.99"))
    assert pg.execute("SELECT count(*) FROM outbox_events").fetchone() == (len(expected) + edits,)


# -- attempts of one task at once, keys through several partitions at once -------------------------------


def test_two_attempts_of_one_task_at_once_apply_it_once(spark, bootstrap, db, pg) -> None:  # type: ignore[no-untyped-def]
    """What Spark's speculation does: the same task's rows, applied by two attempts side by side."""
    one = create_topic(bootstrap, unique("one"), partitions=1)
    expected = produce_orders(bootstrap, one, 3000)
    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": one}
    raw = spark.read.format("kafka_rc").options(**options).load()
    frame = parse_json(raw, SCHEMA, key_column="event_id")
    writer = sink(db).writer(frame)
    # As in any batch after the first: the partition has its ledger row already.
    pg.execute("INSERT INTO sink_progress VALUES ('public.orders', %s, 0, 0)", [one])

    tasks = writer.tasks(frame)
    # Two tasks on local[2]; the table held until both are under way, so they meet in PostgreSQL.
    with psycopg.connect(db.libpq) as holder, ThreadPoolExecutor(1) as pool:
        holder.execute("LOCK TABLE orders IN SHARE MODE")
        running = pool.submit(tasks.union(tasks).collect)
        wait_for(lambda: waiting_on_a_lock(pg) == 2, 120, "both attempts under way")
        holder.commit()
    done = running.result(300)

    assert len(done) == 2 and done[0].staged == done[1].staged > 0
    # One attempt applies the rows, the other waits for it, then finds them applied.
    assert sorted(r.fresh for r in done) == [0, done[0].staged]
    check_exactly_once(pg, bootstrap, one, expected)


def test_one_key_through_several_partitions_at_once_never_deadlocks_the_user_nor_goes_back_a_version(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, checkpoint
) -> None:
    """Two tasks upsert the same keys in opposite orders: they deadlock, and start over, unseen."""
    keys = [str(uuid.uuid4()) for _ in range(8000)]
    versions = {k: random.sample(range(1, 1000), 2) for k in keys}
    producer = transactional_producer(bootstrap)
    for partition, order in ((0, keys), (1, keys[::-1])):
        records = [event(k, versions[k][partition], version=versions[k][partition]) for k in order]
        produce_transaction(producer, topic, records, partition=partition)
    frame = kafka_rc(spark, bootstrap, topic)
    upsert = sink(db, version="version")
    # Both tasks wait at the table, then upsert at the same moment.
    with psycopg.connect(db.libpq) as holder:
        holder.execute("LOCK TABLE orders IN SHARE MODE")
        query = upsert.start(frame, str(checkpoint), trigger={"availableNow": True})
        assert upsert.route is not None and upsert.route.tasks
        wait_for(lambda: waiting_on_a_lock(pg) == 2, 120, "both tasks at the table")
    query.awaitTermination()

    newest = {k: max(v) for k, v in versions.items()}
    assert table(pg) == {k: (v, Decimal("1.00"), v) for k, v in newest.items()}
    assert ledger(pg) == log_ends(bootstrap, topic)
    assert upsert.last is not None and upsert.last.retries >= 1, "the tasks did not deadlock: no test"


def test_one_query_writes_a_sink_at_a_time_in_the_tasks_too(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(3)]
    kafka = "key binary, value binary, topic string, partition int, offset long"
    rows = [(*event(i, n), "t", 0, n) for n, i in enumerate(ids)]
    batch = parse_json(spark.createDataFrame(rows, kafka), SCHEMA, key_column="event_id").coalesce(1)
    first, second = sink(db).writer(batch), sink(db).writer(batch)
    assert first.route.tasks and second.route.tasks
    with first.exclusive(), pytest.raises(SinkError, match="being written by another query"):
        second(batch, 0)
    assert table(pg) == {} and ledger(pg) == {}
    second(batch, 0)  # once the first is done
    assert set(table(pg)) == set(ids) and ledger(pg) == {0: 3}


# -- a task retried after its commit, the driver killed mid-batch, PostgreSQL restarted mid-batch --------


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


def produce_poison(bootstrap: str, topic: str) -> int:
    """Records that become dead letters: applied twice, they would be there twice."""
    poison = [(f"p{i}".encode(), b"{not json") for i in range(10)]
    produce_transaction(transactional_producer(bootstrap), topic, poison)
    return len(poison)


def hold_partition_1(blocker: psycopg.Connection, topic: str) -> None:
    blocker.execute(
        "INSERT INTO sink_progress (sink, topic, kafka_partition, next_offset)"
        " VALUES ('public.orders', %s, 1, 0)",
        [topic],
    )
    blocker.commit()
    blocker.execute("SELECT 1 FROM sink_progress WHERE kafka_partition = 1 FOR UPDATE")


def partition_0_applied_1_waiting(pg: psycopg.Connection) -> bool:
    return ledger(pg).get(0, 0) > 0 and waiting_on_a_lock(pg) == 1


def waiting_on_a_lock(pg: psycopg.Connection) -> int:
    return pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    ).fetchone()[0]


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


class OwnPostgres:
    """A PostgreSQL server of one test's own, which it may restart."""

    def __init__(self, data_dir: Path) -> None:
        from outbox.dev import postgres
        from outbox.dev.process import free_port

        self.server = postgres.start(data_dir, free_port(), die_with_parent=True)
        self.url = DatabaseUrl.parse(self.server.env["DATABASE_URL"])

    def restart(self) -> None:
        """A fast shutdown, which ends every session, then the same server again."""
        from outbox.dev import postgres

        self.stop()
        time.sleep(2)
        self.server = postgres.start(self.server.data_dir, self.server.port, die_with_parent=True)

    def stop(self) -> None:
        from outbox.dev.process import stop

        stop(self.server.pid, signal.SIGINT, timeout=30)


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    server = OwnPostgres(tmp_path / "pg")
    migrate.upgrade(server.url, "public")
    with psycopg.connect(server.url.libpq, autocommit=True) as conn:
        conn.execute(ORDERS)
    yield server
    server.stop()


def test_postgres_restarted_mid_batch(own_postgres: OwnPostgres, bootstrap, topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = own_postgres.url
    expected = produce_orders(bootstrap, topic, 1500)
    dead = produce_poison(bootstrap, topic)
    ends = log_ends(bootstrap, topic)
    streaming = job(bootstrap, topic, url, tmp_path, "streaming", "plain")
    try:
        pg, blocker = psycopg.connect(url.libpq, autocommit=True), psycopg.connect(url.libpq)
        try:
            hold_partition_1(blocker, topic)
            wait_for(lambda: partition_0_applied_1_waiting(pg), 180, "partition 0 committed, 1 waiting")
            own_postgres.restart()  # the waiting task's session ends with the others
        finally:
            pg.close()
            blocker.close()
        with psycopg.connect(url.libpq, autocommit=True) as pg:
            wait_for(lambda: ledger(pg) == ends, 240, "every partition applied after the restart")
            check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    finally:
        streaming.kill9()
    first_batch = applied(streaming.output())[0]
    assert first_batch[0] == 0 and first_batch[3] >= 1, "the waiting task started over after the restart"


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
