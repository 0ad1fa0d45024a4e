"""`create` and `evolve`: a missing table made, a missing column added, a field that no longer
fits its column refused in one line, on both apply paths."""

from __future__ import annotations

import uuid
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import types as T

from outbox.core.errors import ConfigError, OutboxError
from sinks.postgres import PostgresSink
from sinks.postgres.catalog import find
from sinks.postgres.evolve import narrower, widened
from tests.helpers import unique
from tests.sink_support import apply_batches, event, table

pytestmark = pytest.mark.timeout(300)


def columns(pg: psycopg.Connection, name: str = "orders") -> dict[str, str]:
    return dict(
        pg.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [name],
        ).fetchall()
    )


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_create_makes_the_missing_table_from_the_frame_keyed_on_its_key(spark, outbox_db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    sink = PostgresSink("orders", url=outbox_db.raw, create=True)
    apply_batches(spark, sink, [[event(a, 1), event(b, 2, "2.50", 7)], [event(a, 3)]], tasks=tasks)
    assert columns(pg) == {"event_id": "text", "n": "bigint", "amount": "numeric(12,2)", "version": "integer"}
    primary = pg.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'orders'::regclass AND i.indisprimary"
    ).fetchall()
    assert primary == [("event_id",)]
    assert table(pg) == {a: (3, Decimal("1.00"), None), b: (2, Decimal("2.50"), 7)}


def test_without_create_a_missing_table_names_the_option(spark, outbox_db) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="or pass create=True") as refused:
        apply_batches(spark, PostgresSink("orders", url=outbox_db.raw), [[event(str(uuid.uuid4()), 1)]])
    assert refused.value.code == "SINK_TABLE_NOT_FOUND"


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_evolve_adds_a_nullable_column_for_a_field_the_table_lacks(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    pg.execute("ALTER TABLE orders DROP COLUMN amount")
    before = str(uuid.uuid4())
    pg.execute("INSERT INTO orders (event_id, n) VALUES (%s, 0)", [before])
    a = str(uuid.uuid4())
    apply_batches(
        spark, PostgresSink("orders", url=db.raw, evolve=True), [[event(a, 1, "4.20")]], tasks=tasks
    )
    assert columns(pg)["amount"] == "numeric(12,2)"
    assert table(pg) == {before: (0, None, None), a: (1, Decimal("4.20"), None)}
    # Nothing to add the second time: the writer starts as before.
    apply_batches(spark, PostgresSink("orders", url=db.raw, evolve=True), [[]], tasks=tasks)


def test_without_evolve_a_field_the_table_lacks_is_refused_as_before(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    pg.execute("ALTER TABLE orders DROP COLUMN amount")
    with pytest.raises(ConfigError) as refused:
        apply_batches(spark, PostgresSink("orders", url=db.raw), [[event(str(uuid.uuid4()), 1)]])
    assert refused.value.code == "SINK_COLUMNS_NOT_IN_TABLE"
    assert "amount" not in columns(pg)


def test_evolve_behind_an_open_transaction_on_the_table_gives_up_and_changes_nothing(  # type: ignore[no-untyped-def]
    spark, db, pg
) -> None:
    """An application's transaction that wrote a row and is still open: the ALTER waits the lock
    timeout of a migration, not for ever (every write to the table would queue behind it), then
    stops the start in one line; nothing was added."""
    pg.execute("ALTER TABLE orders DROP COLUMN amount")
    with psycopg.connect(db.raw) as app:
        app.execute("INSERT INTO orders (event_id, n) VALUES (%s, 0)", [str(uuid.uuid4())])
        with pytest.raises(OutboxError) as refused:
            sink = PostgresSink("orders", url=db.raw, evolve=True)
            apply_batches(spark, sink, [[event(str(uuid.uuid4()), 1, "4.20")]])
    assert refused.value.code == "SINK_TABLE_LOCKED", refused.value
    assert "waited 5s for public.orders" in str(refused.value) and "pg_stat_activity" in str(refused.value)
    assert "amount" not in columns(pg)


@pytest.mark.parametrize(
    ("alter", "schema", "fragments"),
    [
        (
            "ALTER TABLE orders ALTER COLUMN amount TYPE numeric(10,2)",
            "event_id string, n long, amount decimal(12,2), version int",
            ("public.orders.amount is numeric(10,2)", "a Spark decimal(12,2)", "ALTER TABLE"),
        ),
        (
            "ALTER TABLE orders ALTER COLUMN version TYPE integer",
            "event_id string, n long, amount decimal(12,2), version string",
            ("public.orders.version is integer", "a Spark string", 'TYPE text USING "version"::text'),
        ),
    ],
    ids=["a-wider-decimal", "text-into-an-integer"],
)
def test_a_field_that_no_longer_fits_stops_in_one_line_naming_the_alter_that_takes_it(  # type: ignore[no-untyped-def]
    spark, db, pg, alter, schema, fragments
) -> None:
    pg.execute(alter)
    sink = PostgresSink("orders", url=db.raw, evolve=True)
    with pytest.raises(ConfigError) as refused:
        apply_batches(spark, sink, [[event(str(uuid.uuid4()), 1)]], schema=schema)
    message = str(refused.value)
    assert refused.value.code == "SINK_COLUMN_NO_LONGER_FITS" and "\n" not in message
    assert all(f in message for f in fragments), message
    # The ALTER it names is one PostgreSQL takes, and then the sink starts.
    pg.execute(message.split("To take them: ", 1)[1])
    a = str(uuid.uuid4())
    apply_batches(spark, PostgresSink("orders", url=db.raw, evolve=True), [[event(a, 1)]], schema=schema)
    assert a in table(pg)


@pytest.mark.parametrize(
    ("column_type", "old", "kind", "new"),
    [
        ("numeric(8,2)", ["123456.78", "-0.01"], T.IntegerType(), "2147483647"),
        ("numeric(30,10)", ["12345678901234567890.0123456789", "-1e-10"], T.DoubleType(), "1e300"),
        ("bigint", ["9223372036854775807", "-9007199254740993"], T.DoubleType(), "0.1"),
        ("integer", ["2147483647", "-2147483648"], T.FloatType(), "3.4e38"),
        ("real", ["3.4028235e38", "1.1754944e-38", "0.1"], T.DoubleType(), "1e-300"),
        ("numeric(4,0)", ["9999"], T.DecimalType(10, 3), "1234567.891"),
        ("integer", ["-2147483648"], T.DecimalType(12, 4), "12345678.1234"),
        ("smallint", ["-32768"], T.LongType(), "9223372036854775807"),
        ("integer", ["7", "-7"], T.StringType(), "seven"),
    ],
)
def test_the_alter_a_field_that_no_longer_fits_is_given_keeps_every_old_value(
    pg: psycopg.Connection, column_type: str, old: list[str], kind: T.DataType, new: str
) -> None:
    """SINK_COLUMN_NO_LONGER_FITS names an ALTER (evolve.widened): applied, the column holds each old
    value as it was, and the field's values fit it."""
    name = unique("widened")
    table = sql.Identifier(name)
    pg.execute(sql.SQL("CREATE TABLE {} (id serial PRIMARY KEY, c {})").format(table, sql.SQL(column_type)))
    for value in old:
        pg.execute(sql.SQL("INSERT INTO {} (c) VALUES (%s::{})").format(table, sql.SQL(column_type)), [value])
    found = find(pg, "public", name)
    assert found is not None and narrower(kind, found.columns["c"])
    to = widened(kind, found.columns["c"])

    def values() -> list[object]:
        with pg.cursor(binary=True) as cur:  # a real's exact value, not its shortest text
            return [v for (v,) in cur.execute(sql.SQL("SELECT c FROM {} ORDER BY id").format(table))]

    before = values()
    pg.execute(sql.SQL("ALTER TABLE {0} ALTER COLUMN c TYPE {1} USING c::{1}").format(table, sql.SQL(to)))
    after = values()
    if to == "text":
        assert after == [str(v) for v in before], to
    else:
        assert [Decimal(v) for v in after] == [Decimal(v) for v in before], to  # type: ignore[arg-type]
    widest = find(pg, "public", name)
    assert widest is not None and not narrower(kind, widest.columns["c"]), to
    pg.execute(sql.SQL("INSERT INTO {} (c) VALUES (%s::{})").format(table, sql.SQL(to)), [new])
