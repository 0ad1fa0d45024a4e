"""What the sink refuses or warns of when it starts: a wrong table, frame, key format or ledger."""

from __future__ import annotations

import logging
import re
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict

from outbox import migrate
from outbox.core.errors import ConfigError
from sinks.postgres import PostgresSink, parse_json
from tests.helpers import fresh_database
from tests.sink_support import KAFKA, SCHEMA, apply_batches, event
from tests.source_support import stream


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


def test_a_key_format_parse_json_does_not_know_is_refused_in_one_line(spark) -> None:  # type: ignore[no-untyped-def]
    raw = spark.createDataFrame([], KAFKA)
    with pytest.raises(ConfigError, match="key_format 'avro': give 'text' or 'json'"):
        parse_json(raw, "id string", key_column="id", key_format="avro")  # type: ignore[arg-type]


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
