"""The sink applying in the Spark tasks: split frames, two attempts of a task at once, deadlocks, one writer.

The kills, restarts and retried tasks are in tests/faults/test_sink_tasks_faults.py.

Every test checks row by row against the committed Kafka records: the table,
the ledger, one outbox event per change and no stray dead letter.
"""

from __future__ import annotations

import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import psycopg
import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError
from sinks.postgres import Outbox, PostgresSink, SinkError, parse_json
from tests.helpers import (
    create_topic,
    produce_transaction,
    transactional_producer,
    unique,
    wait_for,
)
from tests.sink_support import (
    KAFKA,
    SCHEMA,
    check_exactly_once,
    event,
    ledger,
    log_ends,
    produce_orders,
    table,
    waiting_on_a_lock,
)
from tests.source_support import stream

OUTBOX = Outbox(topic="out", key="written.event_id::text")


def sink(url: DatabaseUrl, **options) -> PostgresSink:  # type: ignore[no-untyped-def]
    return PostgresSink("orders", url=url.raw, outbox=OUTBOX, **options)


def kafka_rc(spark, bootstrap: str, topic: str, **options: str):  # type: ignore[no-untyped-def]
    return parse_json(stream(spark, bootstrap, topic, **options), SCHEMA, key_column="event_id")


# -- frames that may split a topic-partition: applied on the driver, correct; refused with apply_in='tasks'


def split_frames(spark, bootstrap: str, topic: str, other: str):  # type: ignore[no-untyped-def]
    """Each shape's frame and the sink's options: the sink's own columns count as the frame's."""
    events = kafka_rc(spark, bootstrap, topic, maxOffsetsPerTrigger="400")
    every_n = spark.range(0, 100_000).select(F.col("id").alias("n"))
    # Never true, but a window over keys: Spark shuffles each batch by key to compute it.
    by_key = F.count(F.lit(1)).over(Window.partitionBy("event_id")) < 0
    return {
        "minPartitions": (
            kafka_rc(spark, bootstrap, topic, maxOffsetsPerTrigger="400", minPartitions="6"),
            {},
        ),
        "repartition": (events.repartition(3), {}),
        "union": (events.unionByName(kafka_rc(spark, bootstrap, other, maxOffsetsPerTrigger="400")), {}),
        "join": (events.join(every_n, "n", "left_semi"), {}),
        "a delete rule over a window": (events, {"delete": by_key}),
    }


@pytest.mark.parametrize(
    "shape", ["minPartitions", "repartition", "union", "join", "a delete rule over a window"]
)
def test_a_frame_that_may_split_a_topic_partition_is_applied_on_the_driver_or_refused(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, checkpoint, shape
) -> None:
    other = create_topic(bootstrap, unique("other"), partitions=2)
    expected = produce_orders(bootstrap, topic, 900)
    if shape == "union":
        expected |= produce_orders(bootstrap, other, 600)
    frame, options = split_frames(spark, bootstrap, topic, other)[shape]

    with pytest.raises(ConfigError) as caught:
        sink(db, apply_in="tasks", **options).writer(frame)
    assert caught.value.code == "SINK_TASKS_UNPROVEN"
    auto = sink(db, **options)
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


# Each transaction's second row into orders waits (up to 60 s) until another transaction has its first
# row in too: then each holds a key the other comes to last, whatever the machine's load. A sequence,
# not a table: what an open transaction writes, the other cannot see.
MEET = """
CREATE SEQUENCE arrived;
CREATE FUNCTION meet() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n int := coalesce(nullif(current_setting('test.rows', true), ''), '0')::int + 1;
BEGIN
    PERFORM set_config('test.rows', n::text, true);
    IF n = 2 THEN
        PERFORM nextval('arrived');
        FOR i IN 1..6000 LOOP
            EXIT WHEN (SELECT last_value FROM arrived) >= 2;
            PERFORM pg_sleep(0.01);
        END LOOP;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER meet BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION meet();
"""


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
    frame = kafka_rc(spark, bootstrap, topic, minRecordsPerTask="1")  # a task per partition
    upsert = sink(db, version="version")
    # The tasks meet after their first rows (MEET). A table lock released to both was not enough: a
    # task applies 8,000 rows in a tenth of a second, and on a loaded machine one finished before the
    # other began; nothing deadlocked.
    pg.execute(MEET)
    query = upsert.start(frame, str(checkpoint), trigger={"availableNow": True})
    assert upsert.route is not None and upsert.route.tasks
    query.awaitTermination()

    newest = {k: max(v) for k, v in versions.items()}
    assert table(pg) == {k: (v, Decimal("1.00"), v) for k, v in newest.items()}
    assert ledger(pg) == log_ends(bootstrap, topic)
    assert upsert.last is not None and upsert.last.retries >= 1, "the tasks did not deadlock: no test"


def test_one_query_writes_a_sink_at_a_time_in_the_tasks_too(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(3)]
    rows = [(*event(i, n), "t", 0, n) for n, i in enumerate(ids)]
    batch = parse_json(spark.createDataFrame(rows, KAFKA), SCHEMA, key_column="event_id").coalesce(1)
    first, second = sink(db).writer(batch), sink(db).writer(batch)
    assert first.route.tasks and second.route.tasks
    with first.exclusive(), pytest.raises(SinkError) as caught:
        second(batch, 0)
    assert caught.value.code == "SINK_IN_USE"
    assert table(pg) == {} and ledger(pg) == {}
    second(batch, 0)  # once the first is done
    assert set(table(pg)) == set(ids) and ledger(pg) == {0: 3}
