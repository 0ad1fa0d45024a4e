"""Records the sink cannot apply become dead letters while the batch goes on, or stop it in fail mode."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import pytest

from sinks.postgres import PostgresSink, parse_json
from sinks.postgres.refusal import SinkError
from tests.sink_support import KAFKA, SCHEMA, apply_batches, event, ledger, stage_tables, table


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
