"""Values and names reach PostgreSQL as sent: types, numbers, times, encodings, odd identifiers."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql

from outbox import migrate
from outbox.core.config import DatabaseUrl
from sinks.postgres import Outbox, PostgresSink, parse_json
from tests.helpers import produce_transaction, transactional_producer, unique
from tests.sink_support import KAFKA, apply_batches, log_ends, stage_tables
from tests.source_support import stream


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
