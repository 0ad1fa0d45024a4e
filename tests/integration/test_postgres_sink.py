"""The exactly-once PostgreSQL sink against real Spark, PostgreSQL and Kafka."""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError
from sinks.postgres import Outbox, PostgresSink, parse_json
from sinks.postgres.clock import STAGES
from sinks.postgres.refusal import SinkError
from tests.cli import outbox
from tests.helpers import fresh_database, produce_transaction, transactional_producer, unique
from tests.sink_support import KAFKA, ORDERS, SCHEMA, apply_batches, event, ledger, log_ends, run, table
from tests.source_support import stream


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


@pytest.fixture
def latin1_new_york(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A migrated database in LATIN1 whose time zone is not UTC, as some servers have them."""
    name = unique("latin1")
    with psycopg.connect(server_url.libpq, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET TimeZone = 'America/New_York'").format(sql.Identifier(name))
        )
    url = DatabaseUrl.parse(f"{server_url.raw.rpartition('/')[0]}/{name}")
    migrate.upgrade(url, "public")
    yield url
    with psycopg.connect(server_url.libpq, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_text_and_times_arrive_as_sent_whatever_the_databases_encoding_and_time_zone(  # type: ignore[no-untyped-def]
    spark, latin1_new_york, tasks
) -> None:
    """Sent as UTF-8 CSV and UTC times: a LATIN1 database stored 'café' as 'cafÃ©', and a server in
    New York read a time without a zone as New York's."""
    url = latin1_new_york
    with psycopg.connect(url.raw, autocommit=True) as conn:  # the URL as given: the database's own settings
        conn.execute(
            "CREATE TABLE notes (event_id uuid PRIMARY KEY, note text, at timestamptz, day timestamptz)"
        )
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    body = {"event_id": a, "note": "café", "at": "2026-01-01T00:00:00", "day": "2026-01-01"}
    euro = {"event_id": b, "note": "5 €", "at": "2026-01-01T00:00:00", "day": "2026-01-01"}  # not in LATIN1
    schema = "event_id string, note string, at timestamp_ntz, day date"
    batch = [(a.encode(), json.dumps(body).encode()), (b.encode(), json.dumps(euro).encode())]
    apply_batches(spark, PostgresSink("notes", url=url.raw), [batch], schema, tasks)
    with psycopg.connect(url.libpq) as conn:
        rows = conn.execute("SELECT note, at, day FROM notes").fetchall()
        dead = conn.execute("SELECT kafka_offset, error, value FROM sink_dead_letters").fetchall()
    utc = dt.UTC
    assert rows == [("café", dt.datetime(2026, 1, 1, tzinfo=utc), dt.datetime(2026, 1, 1, tzinfo=utc))]
    # What the database cannot hold is refused, named, and kept whole: never stored as something else.
    assert dead == [
        (
            1,
            'character with byte sequence 0xe2 0x82 0xac in encoding "UTF8" has no equivalent in encoding'
            ' "LATIN1"',
            json.dumps(euro).encode(),
        )
    ]


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


def test_a_ledger_start_from_another_sinks_ledger_is_refused(spark, bootstrap, topic, db) -> None:  # type: ignore[no-untyped-def]
    """kafka_rc's `ledger.sink` (or `ledger.schema`) naming another sink's ledger than the one this sink
    keeps, a typo as a rule: after a lost checkpoint the query would start where that ledger stands,
    or with no rows under the name at startingOffsets (a stream's `latest` skips every event since)."""
    sink = PostgresSink("orders", url=db.raw)
    for other in ({"ledger.sink": "public.ordres"}, {"ledger.sink": sink.name, "ledger.schema": "elsewhere"}):
        frame = stream(spark, bootstrap, topic, **{"ledger.url": db.raw, **other})
        with pytest.raises(ConfigError) as refused:
            sink.writer(parse_json(frame, SCHEMA, key_column="event_id"))
        assert refused.value.code == "SINK_LEDGER_OTHER_SINK", refused.value
        assert f".option('ledger.sink', {sink.name!r})" in str(refused.value), refused.value
    same = stream(spark, bootstrap, topic, **{"ledger.sink": sink.name, "ledger.url": db.raw})
    sink.writer(parse_json(same, SCHEMA, key_column="event_id"))  # its own ledger: taken


def test_a_ledger_start_from_another_database_is_refused(spark, bootstrap, topic, db, server_url) -> None:  # type: ignore[no-untyped-def]
    """kafka_rc's `ledger.url` naming another database than the sink writes to (staging's, another
    cluster's, a database name off by one), under the right sink name: after a lost checkpoint the
    query starts where that database's ledger stands, or with no rows there at startingOffsets. The
    same database under another spelling of its URL is the sink's own."""
    sink = PostgresSink("orders", url=db.raw)
    with fresh_database(server_url) as other:
        migrate.upgrade(other, "public")  # a ledger there, empty: the silent case
        frame = stream(spark, bootstrap, topic, **{"ledger.sink": sink.name, "ledger.url": other.raw})
        with pytest.raises(ConfigError) as refused:
            sink.writer(parse_json(frame, SCHEMA, key_column="event_id"))
    assert refused.value.code == "SINK_LEDGER_OTHER_DATABASE", refused.value
    assert other.safe in str(refused.value) and db.safe in str(refused.value), refused.value
    password = conninfo_to_dict(other.libpq).get("password")
    assert not password or password not in str(refused.value), "a password in the line"
    spelled = (
        db.raw.replace("127.0.0.1", "localhost") + ("&" if "?" in db.raw else "?") + "application_name=x"
    )
    assert spelled != db.raw
    same = stream(spark, bootstrap, topic, **{"ledger.sink": sink.name, "ledger.url": spelled})
    sink.writer(parse_json(same, SCHEMA, key_column="event_id"))  # its own database: taken


def test_poison_records_go_to_dead_letters_and_the_batch_goes_on(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    pg.execute("ALTER TABLE orders ADD CONSTRAINT positive CHECK (n >= 0), ADD COLUMN note varchar(4)")
    good = [str(uuid.uuid4()) for _ in range(5)]
    refused = str(uuid.uuid4())
    poison = [
        (b"k1", b"{not json"),  # does not parse: no key
        (b"k2", json.dumps({"event_id": "not-a-uuid", "n": 1}).encode()),  # conversion failure
        (b"k3", json.dumps({"event_id": refused, "n": -5}).encode()),  # CHECK violation
        (
            b"k4",
            json.dumps({"event_id": str(uuid.uuid4()), "n": 1, "note": "too long"}).encode(),
        ),  # oversized
    ]
    batches = [
        [event(i, n) for n, i in enumerate(good[:3])] + poison,
        [event(i, n) for n, i in enumerate(good[3:])],
    ]
    writer = apply_batches(spark, PostgresSink("orders", url=db.raw), batches, SCHEMA + ", note string")

    assert sorted(table(pg)) == sorted(good)
    dead = pg.execute(
        "SELECT kafka_partition, kafka_offset, key, error FROM sink_dead_letters ORDER BY kafka_offset"
    ).fetchall()
    # Rows refused by the table itself keep their key and the row as JSON; the others, the raw record.
    assert [(p, o, bytes(k)) for p, o, k, _ in dead] == [
        (0, 3, b"k1"),
        (0, 4, b"k2"),
        (0, 5, refused.encode()),
        (0, 6, b"k4"),
    ]
    errors = [e for *_, e in dead]
    assert "the value is not a JSON object of the schema" in errors[0]
    assert "invalid input syntax for type uuid" in errors[1] and "'event_id'" in errors[1]
    assert "positive" in errors[2]
    assert "too long" in errors[3] and "'note'" in errors[3]
    assert writer.last.dead == 0  # the second batch; the first reported 4


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_deferred_foreign_key_that_refuses_a_row_is_a_dead_letter_and_the_batch_goes_on(  # type: ignore[no-untyped-def]
    spark, db, pg, tasks
) -> None:
    """Django makes every foreign key DEFERRABLE INITIALLY DEFERRED. Checked at COMMIT, outside the
    statements that find and dead-letter a refused row, an orphan failed the batch's commit, and
    every replay of it: the query could not get past one event."""
    pg.execute("CREATE TABLE customers (id bigint PRIMARY KEY); INSERT INTO customers VALUES (1), (2)")
    pg.execute(
        "ALTER TABLE orders ADD CONSTRAINT orders_customer FOREIGN KEY (n) REFERENCES customers"
        " DEFERRABLE INITIALLY DEFERRED"
    )
    good, orphan = [str(uuid.uuid4()) for _ in range(2)], str(uuid.uuid4())
    batch = [event(good[0], 1), event(orphan, 99), event(good[1], 2)]
    writer = apply_batches(spark, PostgresSink("orders", url=db.raw), [batch], tasks=tasks)
    assert sorted(table(pg)) == sorted(good)
    dead = pg.execute("SELECT kafka_offset, key, error FROM sink_dead_letters").fetchall()
    assert [(o, bytes(k)) for o, k, _ in dead] == [(1, orphan.encode())], dead
    assert "orders_customer" in dead[0][2], dead
    assert writer.last.dead == 1 and ledger(pg) == {0: 3}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_fail_mode_stops_and_commits_nothing(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    sink = PostgresSink("orders", url=db.raw, on_error="fail")
    with pytest.raises(SinkError, match="@1: the value is not a JSON object of the schema") as caught:
        apply_batches(spark, sink, [[event(str(uuid.uuid4()), 1), (b"k", b"{not json")]], tasks=tasks)
    assert caught.value.code == "SINK_VALUE_UNPARSED"

    assert table(pg) == {} and ledger(pg) == {}
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)
    assert stage_tables(pg) == 0, "a failed batch left its stage table behind"


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_fail_mode_passes_over_an_unreadable_value_the_ledger_counts_as_applied(  # type: ignore[no-untyped-def]
    spark, db, pg, tasks
) -> None:
    """A replay (a lost checkpoint read again from earliest, a partial batch's committed partition)
    holds records the ledger counts as applied. In fail mode an unreadable one among them,
    dead-lettered by an earlier run, stopped the query at every replay: rows the database refuses
    were judged on new records only, values that do not parse on every record."""
    batch = [[event(str(uuid.uuid4()), 1), (b"k", b"{not json")]]
    apply_batches(spark, PostgresSink("orders", url=db.raw), batch, tasks=tasks)  # dead_letter mode
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (1,)
    applied = table(pg)
    writer = apply_batches(spark, PostgresSink("orders", url=db.raw, on_error="fail"), batch, tasks=tasks)
    assert writer.last.fresh == 0 and table(pg) == applied


def stage_tables(pg) -> int:  # type: ignore[no-untyped-def]
    return pg.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'sink_stage_%'").fetchone()[0]


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
@pytest.mark.parametrize(
    ("schema", "name", "column", "ledger_schema"),
    [
        ("public", "50% off", "note", "public"),
        ("public", "orders", "note %s", "public"),
        ("sales %(x)s", "t%%", "n%", "led%s ger"),
    ],
)
def test_percent_signs_in_names_are_names(  # type: ignore[no-untyped-def]
    spark, database, pg, schema, name, column, ledger_schema, tasks
) -> None:
    """psycopg reads % as a placeholder in statements with parameters; names with % must work anyway."""
    for s in {schema, ledger_schema} - {"public"}:
        pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(s)))
    pg.execute(
        sql.SQL("CREATE TABLE {} (event_id uuid PRIMARY KEY, {} text)").format(
            sql.Identifier(schema, name), sql.Identifier(column)
        )
    )
    migrate.upgrade(database, ledger_schema)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    rows = [(i, f"{n}% more", None, b"{}", "t", 0, n) for n, i in enumerate(ids)]
    batch = spark.createDataFrame(rows, f"event_id string, `{column}` string, {KAFKA}")
    batch = batch.coalesce(1) if tasks else batch  # one partition: one task holds all of it
    box = Outbox(topic="100%", key="written.event_id::text || '%'")
    sink = PostgresSink(name, url=database.raw, schema=schema, ledger_schema=ledger_schema, outbox=box)
    writer = sink.writer(batch)
    assert writer.route.tasks == tasks
    writer(batch, 0)

    got = pg.execute(
        sql.SQL("SELECT event_id::text, {} FROM {}").format(
            sql.Identifier(column), sql.Identifier(schema, name)
        )
    ).fetchall()
    assert sorted(got) == sorted((i, f"{n}% more") for n, i in enumerate(ids))
    keys = pg.execute(
        sql.SQL("SELECT convert_from(key, 'UTF8'), topic FROM {}").format(
            sql.Identifier(ledger_schema, "outbox_events")
        )
    ).fetchall()
    assert sorted(keys) == sorted((f"{i}%", "100%") for i in ids)
    assert stage_tables(pg) == 0


def test_hostile_identifiers_are_quoted(spark, bootstrap, topic, database, pg, checkpoint) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import types as T

    schema, ledger_schema = 'sch"ema; --', 'led"ger; DROP TABLE canary; --'
    name, key, amount = 'Or"ders; DROP TABLE canary; --', 'event "id"', "am'ount; ;"
    pg.execute("CREATE TABLE canary (x int)")
    pg.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg.execute(
        sql.SQL("CREATE TABLE {} ({} uuid PRIMARY KEY, {} numeric)").format(
            sql.Identifier(schema, name), sql.Identifier(key), sql.Identifier(amount)
        )
    )
    migrate.upgrade(database, ledger_schema)
    ids = [str(uuid.uuid4()) for _ in range(5)]
    producer = transactional_producer(bootstrap)
    produce_transaction(
        producer, topic, [(i.encode(), json.dumps({key: i, amount: n}).encode()) for n, i in enumerate(ids)]
    )
    fields = T.StructType([T.StructField(key, T.StringType()), T.StructField(amount, T.LongType())])
    frame = parse_json(stream(spark, bootstrap, topic), fields)
    sink = PostgresSink(
        name, url=database.raw, schema=schema, key=key, ledger_schema=ledger_schema, outbox=Outbox(topic="t")
    )
    query = sink.start(frame, str(checkpoint), trigger={"availableNow": True})
    assert sink.route is not None and sink.route.tasks
    query.awaitTermination()

    rows = pg.execute(
        sql.SQL("SELECT {}::text, {} FROM {}").format(
            sql.Identifier(key), sql.Identifier(amount), sql.Identifier(schema, name)
        )
    ).fetchall()
    assert sorted(rows) == sorted((i, n) for n, i in enumerate(ids))
    assert pg.execute("SELECT to_regclass('canary') IS NOT NULL").fetchone() == (True,)
    progress = sql.SQL("SELECT sum(next_offset) FROM {}").format(
        sql.Identifier(ledger_schema, "sink_progress")
    )
    assert pg.execute(progress).fetchone() == (sum(log_ends(bootstrap, topic).values()),)


def test_column_types_round_trip(spark, bootstrap, topic, db, pg, checkpoint) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    from pyspark.sql import functions as F

    pg.execute(
        "CREATE TABLE typed (event_id uuid PRIMARY KEY, doc jsonb, raw_doc json, amount numeric(20,5),"
        " at timestamptz, at_local timestamp, day date, flag boolean, ints int[], words text[], blob bytea,"
        " ratio double precision, small smallint)"
    )
    i = str(uuid.uuid4())
    body = {
        "event_id": i,
        "doc": {"a": 1, "b": ["x", "y"]},
        "raw_doc": '{"k": [1, 2]}',
        "amount": "12345.67891",
        "at": "2024-03-04T05:06:07.123456Z",
        "at_local": "2024-03-04T05:06:07",
        "day": "2024-03-04",
        "flag": True,
        "ints": [1, None, 3],
        "words": ['a "quoted", word', "back\\slash", "{braces}", None, ""],
        "blob": "AAEC/w==",
        "ratio": 0.1,
        "small": 7,
    }
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(i.encode(), json.dumps(body).encode())])
    schema = (
        "event_id string, doc struct<a:int,b:array<string>>, raw_doc string, amount decimal(20,5),"
        " at timestamp, at_local timestamp_ntz, day date, flag boolean, ints array<int>, words array<string>,"
        " blob string, ratio double, small int"
    )
    frame = parse_json(stream(spark, bootstrap, topic), schema).withColumn("blob", F.unbase64("blob"))
    PostgresSink("typed", url=db.raw).start(
        frame, str(checkpoint), trigger={"availableNow": True}
    ).awaitTermination()

    row = pg.execute("SELECT * FROM typed").fetchone()
    assert row is not None
    assert row[1:] == (
        {"a": 1, "b": ["x", "y"]},
        {"k": [1, 2]},
        Decimal("12345.67891"),
        dt.datetime(2024, 3, 4, 5, 6, 7, 123456, tzinfo=dt.UTC),
        dt.datetime(2024, 3, 4, 5, 6, 7),
        dt.date(2024, 3, 4),
        True,
        [1, None, 3],
        ['a "quoted", word', "back\\slash", "{braces}", None, ""],
        b"\x00\x01\x02\xff",
        0.1,
        7,
    )
    assert str(row[0]) == i


@pytest.mark.parametrize(
    ("ddl", "columns", "options", "code", "message"),
    [
        (None, "event_id string, n long", {}, "SINK_TABLE_NOT_FOUND", "does not exist"),
        (
            "CREATE TABLE orders2 (event_id uuid PRIMARY KEY)",
            "event_id string, n long",
            {},
            "SINK_COLUMNS_NOT_IN_TABLE",
            "are not in table",
        ),
        (
            "CREATE TABLE orders2 (event_id uuid PRIMARY KEY, n int NOT NULL)",
            "event_id string",
            {},
            "SINK_REQUIRED_COLUMNS_MISSING",
            "needs columns ['n']",
        ),
        (
            "CREATE TABLE orders2 (event_id uuid, n int)",
            "event_id string, n long",
            {},
            "SINK_NO_UNIQUE_INDEX",
            "no unique index",
        ),
        (
            "CREATE TABLE orders2 (event_id uuid PRIMARY KEY, n numeric)",
            "event_id string, n boolean",
            {},
            "SINK_COLUMN_TYPE_MISMATCH",
            "cannot be written",
        ),
        (
            "CREATE TABLE orders2 (event_id uuid PRIMARY KEY, v text)",
            "event_id string, v string",
            {"version": "v"},
            "SINK_VERSION_NOT_ORDERED",
            "must be a number",
        ),
        (
            "CREATE TABLE orders2 (id uuid PRIMARY KEY)",
            "id string",
            {},
            "SINK_KEY_COLUMNS_ABSENT",
            "key columns ['event_id']",
        ),
    ],
)
def test_mistakes_fail_before_the_query_starts(spark, db, pg, ddl, columns, options, code, message) -> None:  # type: ignore[no-untyped-def]
    if ddl:
        pg.execute(ddl)
    frame = spark.createDataFrame([], f"{columns}, {KAFKA}")
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        PostgresSink("orders2", url=db.raw, **options).writer(frame)
    assert caught.value.code == code


def test_position_columns_and_ledger_are_required(spark, database, db, pg) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as positions:
        PostgresSink("orders", url=db.raw).writer(spark.createDataFrame([], "event_id string, n long"))
    assert positions.value.code == "SINK_POSITION_COLUMNS_MISSING"
    with pytest.raises(ConfigError) as missing:
        PostgresSink("orders", url=db.raw, ledger_schema="elsewhere").writer(
            spark.createDataFrame([], f"event_id string, n long, {KAFKA}")
        )
    assert missing.value.code == "TABLES_MISSING"
    assert "outbox db upgrade --schema elsewhere" in missing.value.message  # the remedy, for that schema

    # Tables of an older revision: the key or the column a later one added is named, with the same remedy.
    frame = spark.createDataFrame([], f"event_id string, n long, {KAFKA}")
    migrate.downgrade(db, "public", "0013")
    with pytest.raises(ConfigError) as keyed:
        PostgresSink("orders", url=db.raw).writer(frame)
    assert keyed.value.code == "TABLES_OUTDATED"
    assert keyed.value.message.startswith("public.sink_batches's primary key (sink, query_id) is missing ")
    migrate.downgrade(db, "public", "0006")
    with pytest.raises(ConfigError) as behind:
        PostgresSink("orders", url=db.raw).writer(
            spark.createDataFrame([], f"event_id string, n long, {KAFKA}")
        )
    assert behind.value.code == "TABLES_OUTDATED"
    assert behind.value.message.startswith(
        "public.sink_batches.result, public.sink_batches's primary key (sink, query_id) are missing "
    ), behind.value.message
    assert "outbox db upgrade --schema public" in behind.value.message


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


def test_a_field_that_does_not_read_as_its_type_is_a_dead_letter_never_null(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    """The README's own schema: a decimal "not-a-number" or a version "seven" used to become NULL."""
    good, bad_amount, bad_version, tombstone = (str(uuid.uuid4()) for _ in range(4))
    records = [
        (good, {"event_id": good, "n": 1, "amount": "2.50", "version": 3}),
        (bad_amount, {"event_id": bad_amount, "n": 2, "amount": "not-a-number"}),
        (bad_version, {"event_id": bad_version, "n": 3, "version": "seven"}),
        (tombstone, None),  # a delete: a null value is no parse error
        ("no-key", {"n": 5}),  # parses, but names no key
    ]
    rows = [
        (k.encode(), None if v is None else json.dumps(v).encode(), "t", 0, offset)
        for offset, (k, v) in enumerate(records)
    ]
    events = parse_json(spark.createDataFrame(rows, KAFKA), SCHEMA, key_column="event_id")
    PostgresSink("orders", url=db.raw, version="version").writer(events)(events, 0)

    assert table(pg) == {good: (1, Decimal("2.50"), 3)}
    dead = dict(pg.execute("SELECT kafka_offset, error FROM sink_dead_letters").fetchall())
    assert set(dead) == {1, 2, 4}
    assert "field 'amount': not-a-number is not a valid decimal(12,2)" in dead[1]
    assert "field 'version': seven is not a valid int" in dead[2]
    assert "key column 'event_id' is null" in dead[4]
    assert ledger(pg) == {0: 5}


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
def test_fractions_into_integer_columns_write_their_integral_values_and_dead_letter_the_rest(  # type: ignore[no-untyped-def]
    spark, db, pg, tasks: bool
) -> None:
    """JSON numbers often parse as decimal or double: 3.00 into a bigint is 3, 2.5 is refused by the table."""
    pg.execute("CREATE TABLE counts (event_id text PRIMARY KEY, qty bigint, small smallint)")
    records = [
        ("whole", {"event_id": "whole", "qty": "3.00", "small": 4.0}),
        ("huge", {"event_id": "huge", "qty": "9007199254740993.00", "small": -7.0}),
        ("half", {"event_id": "half", "qty": "2.50", "small": 1.0}),
        ("float", {"event_id": "float", "qty": "1", "small": 1.5}),
        ("too-big", {"event_id": "too-big", "qty": "1", "small": 70000.0}),
    ]
    rows = [(k.encode(), json.dumps(v).encode(), "t", 0, offset) for offset, (k, v) in enumerate(records)]
    raw = spark.createDataFrame(rows, KAFKA)
    schema = "event_id string, qty decimal(20,2), small double"
    events = parse_json(raw.coalesce(1) if tasks else raw.repartition(2), schema, key_column="event_id")
    writer = PostgresSink("counts", url=db.raw).writer(events)
    assert writer.route.tasks == tasks
    writer(events, 0)

    written = dict(pg.execute("SELECT event_id, (qty, small) FROM counts").fetchall())
    assert written == {"whole": ("3", "4"), "huge": ("9007199254740993", "-7")}
    dead = dict(pg.execute("SELECT kafka_offset, error FROM sink_dead_letters").fetchall())
    assert sorted(dead) == [2, 3, 4]
    assert 'invalid input syntax for type bigint: "2.50"' in dead[2]
    assert 'invalid input syntax for type smallint: "1.5"' in dead[3]
    assert "out of range for type smallint" in dead[4]


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_whole_double_into_a_bigint_keeps_its_exact_value(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """Spark's cast of a double to decimal goes through its shortest text: 2**60 became
    1152921504606846980 in the table, another number, and nothing was said."""
    pg.execute("CREATE TABLE totals (event_id text PRIMARY KEY, qty bigint)")
    values = {"2^60": 2**60, "-2^63": -(2**63), "3": 3.0, "over": 9.3e18, "2^63": 2.0**63}
    rows = [
        (k.encode(), json.dumps({"event_id": k, "qty": v}).encode(), "t", 0, o)
        for o, (k, v) in enumerate(values.items())
    ]
    raw = spark.createDataFrame(rows, KAFKA)
    events = parse_json(raw.coalesce(1) if tasks else raw.repartition(2), "event_id string, qty double")
    writer = PostgresSink("totals", url=db.raw).writer(events)
    assert writer.route.tasks == tasks
    writer(events, 0)

    assert dict(pg.execute("SELECT event_id, qty FROM totals").fetchall()) == {
        "2^60": 2**60,
        "-2^63": -(2**63),
        "3": 3,
    }
    dead = dict(pg.execute("SELECT kafka_offset, error FROM sink_dead_letters").fetchall())
    assert sorted(dead) == [3, 4] and all("bigint" in e for e in dead.values()), dead


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_tombstone_whose_kafka_key_is_not_of_the_key_columns_type_is_a_dead_letter(  # type: ignore[no-untyped-def]
    spark, db, pg, tasks: bool
) -> None:
    """Spark's ANSI mode (on by default) fails a cast it cannot do: a tombstone keyed by Java's
    LongSerializer (8 bytes) for a bigint key column failed the batch, and every replay of it."""
    pg.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, n bigint)")
    java_long = (2).to_bytes(8, "big")
    records = [(b"1", {"id": 1, "n": 1}), (b"2", {"id": 2, "n": 2}), (java_long, None), (b"1", None)]
    rows = [(k, json.dumps(v).encode() if v else None, "t", 0, o) for o, (k, v) in enumerate(records)]
    raw = spark.createDataFrame(rows, KAFKA)
    events = parse_json(raw.coalesce(1) if tasks else raw.repartition(2), "id long, n long", key_column="id")
    writer = PostgresSink("accounts", url=db.raw, key="id").writer(events)
    assert writer.route.tasks == tasks
    writer(events, 0)

    assert pg.execute("SELECT id, n FROM accounts").fetchall() == [(2, 2)]
    dead = pg.execute("SELECT kafka_offset, error, key, value FROM sink_dead_letters").fetchall()
    assert dead == [
        (2, "the Kafka key of this tombstone is not a valid bigint for key column 'id'", java_long, None)
    ]


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


def test_a_key_format_parse_json_does_not_know_is_refused_in_one_line(spark) -> None:  # type: ignore[no-untyped-def]
    raw = spark.createDataFrame([], KAFKA)
    with pytest.raises(ConfigError, match="key_format 'avro': give 'text' or 'json'"):
        parse_json(raw, "id string", key_column="id", key_format="avro")  # type: ignore[arg-type]


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_row_the_tables_trigger_refuses_is_a_dead_letter(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """A validation trigger's RAISE EXCEPTION (SQLSTATE P0001) refuses a row, as a CHECK does: the
    row is a dead letter and the rest applied, where it failed the batch and every replay of it."""
    pg.execute(
        "CREATE FUNCTION no_negative() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.n < 0 THEN RAISE EXCEPTION 'n must not be negative, got %', NEW.n; END IF;"
        " RETURN NEW; END $$"
    )
    pg.execute(
        "CREATE TRIGGER orders_no_negative BEFORE INSERT OR UPDATE ON orders"
        " FOR EACH ROW EXECUTE FUNCTION no_negative()"
    )
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    writer = apply_batches(
        spark, PostgresSink("orders", url=db.raw), [[event(good, 1), event(bad, -1)]], tasks=tasks
    )

    assert table(pg) == {good: (1, Decimal("1.00"), None)}
    dead = pg.execute("SELECT kafka_offset, error FROM sink_dead_letters").fetchall()
    assert dead == [(1, "n must not be negative, got -1")]
    assert writer.last.dead == 1


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


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_times_inside_json_keep_their_microseconds(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """A struct into jsonb goes through Spark's to_json, whose times have milliseconds by default."""
    pg.execute("CREATE TABLE docs (event_id uuid PRIMARY KEY, doc jsonb)")
    i = str(uuid.uuid4())
    body = {
        "event_id": i,
        "doc": {"at": "2024-03-04T05:06:07.123456Z", "local": "2024-03-04T05:06:07.654321"},
    }
    schema = "event_id string, doc struct<at: timestamp, local: timestamp_ntz>"
    apply_batches(
        spark, PostgresSink("docs", url=db.raw), [[(i.encode(), json.dumps(body).encode())]], schema, tasks
    )

    at, local = pg.execute(
        "SELECT (doc->>'at')::timestamptz, (doc->>'local')::timestamp FROM docs"
    ).fetchone()
    assert at == dt.datetime(2024, 3, 4, 5, 6, 7, 123456, tzinfo=dt.UTC)
    assert local == dt.datetime(2024, 3, 4, 5, 6, 7, 654321)


def test_times_inside_json_are_the_instants_sent_in_any_session_time_zone(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    """to_json writes a time in the session's zone, its offset to the minute: where a zone's offset
    had seconds (Monrovia until 1972, most zones before 1900) the instant moved by them."""
    pg.execute("CREATE TABLE docs (event_id uuid PRIMARY KEY, doc jsonb)")
    sent = {str(uuid.uuid4()): at for at in ("1971-01-01T12:00:00Z", "1890-06-01T00:00:00.5Z")}
    batch = [(i.encode(), json.dumps({"event_id": i, "doc": {"at": at}}).encode()) for i, at in sent.items()]
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Africa/Monrovia")
    try:
        apply_batches(
            spark, PostgresSink("docs", url=db.raw), [batch], "event_id string, doc struct<at: timestamp>"
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)
    got = dict(pg.execute("SELECT event_id::text, (doc->>'at')::timestamptz FROM docs").fetchall())
    assert got == {i: dt.datetime.fromisoformat(at) for i, at in sent.items()}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_null_field_of_a_struct_into_jsonb_stays_in_the_document(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """Spark's to_json leaves null fields out unless told: {"a": null, "b": 1} landed as {"b": 1}."""
    pg.execute("CREATE TABLE docs (event_id uuid PRIMARY KEY, doc jsonb)")
    i = str(uuid.uuid4())
    body = {"event_id": i, "doc": {"a": None, "b": 1}}
    schema = "event_id string, doc struct<a: string, b: int>"
    apply_batches(
        spark, PostgresSink("docs", url=db.raw), [[(i.encode(), json.dumps(body).encode())]], schema, tasks
    )
    assert pg.execute("SELECT doc FROM docs").fetchone()[0] == {"a": None, "b": 1}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_value_whose_unreadable_field_holds_a_nul_is_a_dead_letter(spark, db, pg, tasks: bool) -> None:  # type: ignore[no-untyped-def]
    """The parse error quotes the field; PostgreSQL text holds no NUL, so writing the dead letter
    failed the task, and every replay of the batch: the query stood still."""
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    batch = [
        (good.encode(), json.dumps({"event_id": good, "n": 1, "amount": "2.50"}).encode()),
        (bad.encode(), json.dumps({"event_id": bad, "n": 2, "amount": "x\u0000y"}).encode()),
    ]
    apply_batches(spark, PostgresSink("orders", url=db.raw), [batch], SCHEMA, tasks)
    assert set(table(pg)) == {good}
    [(error,)] = pg.execute("SELECT error FROM sink_dead_letters").fetchall()
    assert "field 'amount': x\\u0000y is not a valid decimal(12,2)" in error, error


@pytest.mark.parametrize(
    ("index", "refused"),
    [
        # ON CONFLICT takes no deferrable constraint, nor an index a failed CREATE INDEX
        # CONCURRENTLY left invalid: every batch failed, after the query had started.
        ("ALTER TABLE orders2 ADD UNIQUE (event_id) DEFERRABLE", True),
        ("CREATE UNIQUE INDEX ON orders2 (event_id) INCLUDE (n)", False),  # INCLUDE: no key column
    ],
)
def test_only_a_unique_index_on_conflict_can_use_makes_the_key(
    spark, db, pg, index: str, refused: bool
) -> None:  # type: ignore[no-untyped-def]
    pg.execute("CREATE TABLE orders2 (event_id uuid NOT NULL, n int)")
    pg.execute(index)
    frame = spark.createDataFrame([], f"event_id string, n long, {KAFKA}")
    if refused:
        with pytest.raises(ConfigError) as caught:
            PostgresSink("orders2", url=db.raw).writer(frame)
        assert caught.value.code == "SINK_NO_UNIQUE_INDEX"
    else:
        PostgresSink("orders2", url=db.raw).writer(frame)


def test_a_frame_without_kafkas_binary_value_is_told_that_no_record_deletes(  # type: ignore[no-untyped-def]
    spark, db, caplog
) -> None:
    """delete='tombstone' (the default) reads Kafka's binary `value`: a frame that cast it to text
    (the usual `CAST(value AS STRING)` before a hand-written from_json) or dropped it has none, and a
    tombstone would upsert its key with empty columns. Said at start, where it can be mended."""
    fields = "event_id string, n long, value string, topic string, partition int, offset long"
    frame = spark.createDataFrame([("a", 1, None, "t", 0, 0)], fields)
    with caplog.at_level(logging.WARNING, logger="sinks"):
        PostgresSink("orders", url=db.raw).writer(frame)
        PostgresSink("orders", url=db.raw, delete=None).writer(frame)
    told = [r.getMessage() for r in caplog.records if "tombstone" in r.getMessage()]
    assert len(told) == 1 and "binary `value`" in told[0], told


def test_a_table_emptied_under_its_ledger_is_told_at_start_with_the_remedy(  # type: ignore[no-untyped-def]
    spark, db, pg, caplog
) -> None:
    """Truncated or made again to be rebuilt from the topic: the ledger still says every event was
    applied, so a new query from earliest skips them all and the table stays empty, without a word.
    Said at start, with the ledger rows to delete for a rebuild; a table never written is not."""
    frame = parse_json(spark.createDataFrame([], KAFKA), SCHEMA, key_column="event_id")
    with caplog.at_level(logging.WARNING, logger="sinks"):
        PostgresSink("orders", url=db.raw).writer(frame)  # empty, and nothing applied yet
        apply_batches(spark, PostgresSink("orders", url=db.raw), [[event(str(uuid.uuid4()), 1)]])
        PostgresSink("orders", url=db.raw).writer(frame)  # holds its row
        assert not [r for r in caplog.records if "ledger" in r.getMessage()]
        pg.execute("TRUNCATE orders")
        PostgresSink("orders", url=db.raw).writer(frame)
    [told] = [r.getMessage() for r in caplog.records if "ledger" in r.getMessage()]
    assert "public.orders is empty" in told and "sink_progress" in told, told
