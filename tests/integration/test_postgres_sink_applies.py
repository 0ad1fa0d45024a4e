"""The sink applies each event once: upserts, deletes, versions, its outbox, replays, stages and lock."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict
from decimal import Decimal

import pytest
from psycopg import sql

from sinks.postgres import Outbox, PostgresSink, parse_json
from sinks.postgres.clock import STAGES
from sinks.postgres.refusal import SinkError
from tests.cli import outbox
from tests.helpers import produce_transaction, transactional_producer
from tests.sink_support import KAFKA, ORDERS, apply_batches, event, ledger, log_ends, run, table


def test_duplicates_within_and_across_batches_apply_once(spark, bootstrap, topic, db, pg, checkpoint) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(60)]
    producer = transactional_producer(bootstrap)
    first = [event(i, n) for n, i in enumerate(ids[:40])]
    produce_transaction(producer, topic, first + first[:10])  # duplicates inside one batch
    produce_transaction(producer, topic, [event(i, n, "2.00") for n, i in enumerate(ids[:20])])  # later edits
    produce_transaction(producer, topic, [event(i, n + 40) for n, i in enumerate(ids[40:])])
    produce_transaction(producer, topic, [event(ids[0], 999)], commit=False)  # never applied

    sink = run(
        spark, bootstrap, topic, checkpoint, PostgresSink("orders", url=db.raw), maxOffsetsPerTrigger="25"
    )

    rows = table(pg)
    assert sorted(rows) == sorted(ids)
    assert all(rows[i] == (n, Decimal("2.00"), None) for n, i in enumerate(ids[:20]))
    assert all(rows[i] == (n, Decimal("1.00"), None) for n, i in enumerate(ids) if n >= 20)
    assert ledger(pg) == log_ends(bootstrap, topic)
    assert sink.last is not None and sink.last.dead == 0
    # Where its tasks' time went, stage by stage (what bench/sink.py breaks a run's cost into).
    assert list(sink.last.stages) == list(STAGES) and sink.last.stages["copy"] > 0 < sink.last.stages["apply"]
    # The same outcome recorded beside the batch, where a Spark Connect client reads it.
    assert pg.execute("SELECT result FROM sink_batches").fetchall() == [(asdict(sink.last),)]


def test_versions_never_move_backwards(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    sink = PostgresSink("orders", url=db.raw, version="version")

    apply_batches(
        spark,
        sink,
        [
            [event(a, 3, "3.00", 3), event(a, 1, "1.00", 1)],
            [event(b, 1, "1.00", 1), event(a, 2, "2.00", 2)],
            [event(b, 5, "5.00", 5), event(b, 4, "4.00", 4)],
        ],
    )

    assert table(pg) == {a: (3, Decimal("3.00"), 3), b: (5, Decimal("5.00"), 5)}
    assert ledger(pg) == {0: 6}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_tombstones_delete_from_a_table_with_a_value_column(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    """Key-value tables often have a `value` column: the Kafka value written there is still what
    says a record is a tombstone."""
    pg.execute(
        "CREATE TABLE kv (event_id uuid PRIMARY KEY, n bigint, amount numeric, version int, value bytea)"
    )
    kept, gone = str(uuid.uuid4()), str(uuid.uuid4())
    batches = [[event(kept, 1), event(gone, 2)], [(gone.encode(), None)]]
    apply_batches(spark, PostgresSink("kv", url=db.raw), batches, tasks=tasks)
    rows = pg.execute("SELECT event_id::text, n, value IS NOT NULL FROM kv").fetchall()
    assert rows == [(kept, 1, True)]


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_keys_that_differ_as_text_but_are_one_value_in_postgresql(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    """A uuid in lower and in upper case is one key: applied one after the other, in one batch
    (not refused as 'ON CONFLICT ... cannot affect row a second time', not a delete lost)."""
    upserted, deleted = str(uuid.uuid4()), str(uuid.uuid4())
    batch = [
        event(upserted, 1),
        event(upserted.upper(), 2),
        event(deleted, 3),
        (deleted.upper().encode(), None),
    ]
    writer = apply_batches(spark, PostgresSink("orders", url=db.raw), [batch], tasks=tasks)
    assert table(pg) == {upserted: (2, Decimal("1.00"), None)}
    assert writer.last.dead == 0 and writer.last.deleted == 1 and ledger(pg) == {0: 4}


def test_insert_mode_keeps_the_first_event(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    a = str(uuid.uuid4())

    apply_batches(
        spark, PostgresSink("orders", url=db.raw, mode="insert"), [[event(a, 1), event(a, 2)], [event(a, 3)]]
    )

    assert table(pg) == {a: (1, Decimal("1.00"), None)}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_tombstones_delete_and_feed_the_outbox(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    keep, gone, back = (str(uuid.uuid4()) for _ in range(3))
    outbox = Outbox(topic="orders.changed", key="written.event_id::text", headers={"n": "written.n"})
    sink = PostgresSink("orders", url=db.raw, outbox=outbox)

    batches = [
        [event(keep, 1), event(gone, 2), event(back, 3)],
        [(gone.encode(), None), (back.encode(), None)],
        [event(back, 4)],
    ]
    apply_batches(spark, sink, batches, tasks=tasks)

    assert table(pg) == {keep: (1, Decimal("1.00"), None), back: (4, Decimal("1.00"), None)}
    events = pg.execute(
        "SELECT convert_from(key, 'UTF8'), value IS NULL, header_keys, header_values"
        " FROM outbox_events ORDER BY id"
    ).fetchall()
    history: dict[str, list[bool]] = {}
    for k, deleted, _, _ in events:
        history.setdefault(k, []).append(deleted)
    assert history == {keep: [False], gone: [False, True], back: [False, True, False]}
    assert [(h, [bytes(v) for v in vs]) for _, _, h, vs in events][-1] == (["n"], [b"4"])
    values = pg.execute(
        "SELECT convert_from(value, 'UTF8')::jsonb FROM outbox_events WHERE value IS NOT NULL"
    ).fetchall()
    assert sorted((v["event_id"], v["n"]) for (v,) in values) == sorted(
        [(keep, 1), (gone, 2), (back, 3), (back, 4)]
    )


def test_lost_checkpoint_neither_duplicates_nor_skips(spark, bootstrap, topic, db, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(30)]
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [event(i, n) for n, i in enumerate(ids[:20])])
    outbox = Outbox(topic="orders.changed", key="written.event_id::text")
    sink = PostgresSink("orders", url=db.raw, outbox=outbox)
    run(spark, bootstrap, topic, tmp_path / "first", sink)
    produce_transaction(producer, topic, [event(i, n + 20) for n, i in enumerate(ids[20:])])

    # A fresh checkpoint replays the whole topic: the ledger turns the old events into no-ops.
    replay = run(spark, bootstrap, topic, tmp_path / "second", sink).last
    # Starting from the ledger reads nothing twice.
    produce_transaction(producer, topic, [event(ids[0], 100)])
    ledger_start = {"ledger.sink": sink.name, "ledger.url": db.raw}
    resumed = run(spark, bootstrap, topic, tmp_path / "third", sink, **ledger_start).last

    rows = table(pg)
    assert sorted(rows) == sorted(ids) and rows[ids[0]][0] == 100
    assert replay is not None and replay.replayed == 20 and replay.upserted == 10
    assert resumed is not None and resumed.staged == 1 and resumed.replayed == 0
    assert pg.execute("SELECT count(*) FROM outbox_events").fetchone() == (31,)
    assert ledger(pg) == log_ends(bootstrap, topic)


def test_one_running_query_per_sink(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    i = str(uuid.uuid4())
    batch = spark.createDataFrame([(i, 1, None, b"{}", "t", 0, 0)], f"event_id string, n long, {KAFKA}")
    first = PostgresSink("orders", url=db.raw).writer(batch)
    second = PostgresSink("orders", url=db.raw).writer(batch)
    staged = first.stage(batch, 0)
    with pytest.raises(SinkError) as caught:
        second(batch, 0)
    assert caught.value.code == "SINK_IN_USE"
    first.apply(staged)
    second(batch, 0)  # once the first is done: a replay, nothing changes
    assert table(pg) == {i: (1, None, None)} and ledger(pg) == {0: 1}
    assert second.last is not None and second.last.replayed == 1


def test_a_stage_that_lost_rows_applies_nothing(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(3)]
    batch = spark.createDataFrame(
        [(i, n, None, b"{}", "t", 0, n) for n, i in enumerate(ids)], f"event_id string, n long, {KAFKA}"
    )
    writer = PostgresSink("orders", url=db.raw).writer(batch)
    staged = writer.stage(batch, 0)
    # What a crash of PostgreSQL does to the unlogged stage table: its rows are gone.
    pg.execute(sql.SQL("DELETE FROM {} WHERE _offset = 1").format(writer.statements.names.stage))
    with pytest.raises(SinkError, match="holds 2 of 3 staged rows") as caught:
        writer.apply(staged)
    assert caught.value.code == "SINK_STAGE_INCOMPLETE"
    assert table(pg) == {} and ledger(pg) == {}
    writer(batch, 0)  # the replay Spark makes of the failed batch
    assert set(table(pg)) == set(ids) and ledger(pg) == {0: 3}


def test_a_failed_batch_frees_the_sink_before_its_connection_ends(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    """Closing a connection frees its advisory lock only once the server's backend has ended, a
    moment later: Spark's replay of a failed batch met the lock still held and stopped as SINK_IN_USE
    (a busy host, in test_a_stage_that_lost_rows_applies_nothing). Here the backend outlives the
    close for as long as the test keeps it."""
    ids = [str(uuid.uuid4()) for _ in range(3)]
    batch = spark.createDataFrame(
        [(i, n, None, b"{}", "t", 0, n) for n, i in enumerate(ids)], f"event_id string, n long, {KAFKA}"
    )
    writer = PostgresSink("orders", url=db.raw).writer(batch)
    staged = writer.stage(batch, 0)
    close, staged.conn.close = staged.conn.close, lambda: None
    try:
        pg.execute(sql.SQL("DELETE FROM {} WHERE _offset = 1").format(writer.statements.names.stage))
        with pytest.raises(SinkError, match="holds 2 of 3 staged rows"):
            writer.apply(staged)
        writer(batch, 0)  # the replay Spark makes of the failed batch, at once
    finally:
        close()
    assert set(table(pg)) == set(ids) and ledger(pg) == {0: 3}


def test_the_result_does_not_depend_on_where_batches_split(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    """Issue reproductions: E v1, tombstone, E v2 ends at v2; a refused v2 keeps the valid v1."""
    pg.execute("ALTER TABLE orders ADD CONSTRAINT positive CHECK (amount >= 0)")
    pg.execute(ORDERS.replace("orders", "orders_split"))
    pg.execute("ALTER TABLE orders_split ADD CONSTRAINT positive_split CHECK (amount >= 0)")
    e, e1 = str(uuid.uuid4()), str(uuid.uuid4())
    records = [
        event(e, 1, "1.00", version=1),
        (e.encode(), None),  # tombstone
        event(e, 2, "2.00", version=2),
        event(e1, 1, "1.00", version=1),
        event(e1, 2, "-1.00", version=2),  # refused by the CHECK
    ]

    apply_batches(spark, PostgresSink("orders", url=db.raw, version="version"), [records])
    split = PostgresSink("orders_split", url=db.raw, version="version")
    apply_batches(spark, split, [[record] for record in records])

    expected = {e: (2, Decimal("2.00"), 2), e1: (1, Decimal("1.00"), 1)}
    assert table(pg) == expected
    assert table(pg, "orders_split") == expected
    dead = pg.execute("SELECT sink, kafka_offset FROM sink_dead_letters ORDER BY sink").fetchall()
    assert dead == [("public.orders", 4), ("public.orders_split", 4)]


def test_a_stage_left_by_a_killed_batch_is_listed_then_dropped_when_its_sink_starts(  # type: ignore[no-untyped-def]
    spark, db, pg, bootstrap
) -> None:
    batch = spark.createDataFrame(
        [(str(uuid.uuid4()), 1, None, b"{}", "t", 0, 0)], f"event_id string, n long, {KAFKA}"
    )
    killed = PostgresSink("orders", url=db.raw).writer(batch)
    killed.stage(batch, 0).conn.close()  # the driver dies between staging and applying
    live = PostgresSink("orders", url=db.raw, name="live").writer(batch)
    staging = live.stage(batch, 0)  # another query, mid-batch
    stages = [w.statements.names.stage.as_string(pg).split(".")[1].strip('"') for w in (killed, live)]

    def check() -> str:
        env = {"DATABASE_URL": db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        result = outbox("check", "--no-java", env=env)
        assert result.code == 0, result.out
        return next(line for line in result.out.splitlines() if "stage tables" in line)

    assert check().startswith(
        f"WARN stage tables: 2 in schema 'public' ({', '.join(sorted(stages))}), left by"
    )
    PostgresSink("orders", url=db.raw).writer(batch)  # the killed sink starts again
    assert check().startswith(f"WARN stage tables: 1 in schema 'public' ({stages[1]}), left by")
    live.apply(staging)  # the live query's stage was not touched
    assert check() == "ok   stage tables: none left in schema 'public'"


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_tombstone_keyed_in_json_deletes_its_row(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """Kafka Connect's JsonConverter and Debezium write keys as JSON: "a", {"id": "b"}, or with
    schemas.enable the {"schema": .., "payload": {"id": "c"}} envelope. Read as text, such a
    tombstone's key was '"a"': it deleted nothing, and nothing was said. key_format="json" reads it."""
    pg.execute("CREATE TABLE accounts (id text PRIMARY KEY, n bigint)")
    envelope = {
        "schema": {"type": "struct", "fields": [{"field": "id", "type": "string"}]},
        "payload": {"id": "c"},
    }
    keys = [b'"a"', b'{"id": "b"}', json.dumps(envelope).encode(), b"d", b"[1]", b'\t"e\\"" ', b"null"]
    records = [(None, {"id": i, "n": n}) for n, i in enumerate(["a", "b", "c", "d", 'e"', "f"])]
    records += [(k, None) for k in keys]
    rows = [(k, json.dumps(v).encode() if v else None, "t", 0, o) for o, (k, v) in enumerate(records)]
    raw = spark.createDataFrame(rows, KAFKA)
    events = parse_json(
        raw.coalesce(1) if tasks else raw.repartition(2),
        "id string, n long",
        key_column="id",
        key_format="json",
    )
    writer = PostgresSink("accounts", url=db.raw, key="id").writer(events)
    assert writer.route.tasks == tasks
    writer(events, 0)

    assert pg.execute("SELECT id, n FROM accounts ORDER BY id").fetchall() == [("d", 3), ("f", 5)]
    dead = pg.execute("SELECT kafka_offset, error FROM sink_dead_letters ORDER BY 1").fetchall()
    why = "the Kafka key of this tombstone, read as JSON, is no string for key column 'id'"
    assert [o for o, _ in dead] == [9, 10, 12] and all(why in e for _, e in dead), dead


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_change_that_equality_calls_no_change_is_applied(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """A later event whose values are equal to the row's by their type's `=` but not the same values
    (citext, a numeric's scale, a number in jsonb, -0.0, an interval of 24 hours for one of a day)
    is a change: it was taken for a redelivery and left the old values."""
    pg.execute("CREATE EXTENSION IF NOT EXISTS citext")
    pg.execute(
        "CREATE TABLE profiles (event_id uuid PRIMARY KEY, email citext,"
        " ratio numeric, doc jsonb, zero float8, span interval)"
    )
    i = str(uuid.uuid4())
    old = {
        "email": "bob@x.com",
        "ratio": "1.5",
        "doc": '{"p": 1}',
        "zero": 0.0,
        "span": "1 day",
    }
    new = {
        "email": "Bob@X.com",
        "ratio": "1.50",
        "doc": '{"p": 1.0}',
        "zero": -0.0,
        "span": "24:00:00",
    }
    schema = "event_id string, email string, ratio string, doc string, zero double, span string"
    batches = [[(i.encode(), json.dumps({"event_id": i, **v}).encode())] for v in (old, new)]
    writer = apply_batches(spark, PostgresSink("profiles", url=db.raw), batches, schema, tasks)

    row = pg.execute(
        "SELECT email::text, ratio::text, doc::text, zero::text, span::text FROM profiles"
    ).fetchone()
    assert row == ("Bob@X.com", "1.50", '{"p": 1.0}', "-0", "24:00:00")
    assert writer.last.upserted == 1
