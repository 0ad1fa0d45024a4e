"""The sink's SQL as text, the way Alembic tests its operations: each rule shows in the statement.

What these tests pin is the shape that exactly-once rests on: which ledger a
statement reads, the lock order, the conflict rule, the version guard, the
outbox columns. Whether PostgreSQL then does the right thing is the
integration tests' job.
"""

from __future__ import annotations

import hashlib

import pytest
from psycopg import sql
from pyspark.sql import types as T

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from sinks.postgres.catalog import Column, Table
from sinks.postgres.plan import plan
from sinks.postgres.settings import Outbox
from sinks.postgres.spec import SinkSpec
from sinks.postgres.statements import Names, Statements

URL = DatabaseUrl.parse("postgresql://u:secret@db:5432/app")
POSITION = [
    T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()),
]


def statements(table: str = "orders", *, in_task: bool = False, **options: object) -> Statements:
    """Statements for a table (event_id uuid key, n bigint, v bigint) and a frame that writes all three."""
    columns = {
        "event_id": Column("event_id", "uuid", "U", "uuid", None, True, False, False),
        "n": Column("n", "bigint", "N", "int8", None, False, False, False),
        "v": Column("v", "bigint", "N", "int8", None, False, False, False),
    }
    spec = SinkSpec(url=URL, table=table, **options)  # type: ignore[arg-type]
    found = Table(spec.schema, table, columns, (frozenset({"event_id"}),))
    frame = T.StructType(
        [T.StructField(c, T.StringType() if c == "event_id" else T.LongType()) for c in columns] + POSITION
    )
    return Statements(spec, plan(frame, found, spec), in_task=in_task)


def text(statement: sql.Composable) -> str:
    return statement.as_string(None)


def test_the_stage_is_named_for_the_sink_and_a_task_stages_in_its_own_temp_table() -> None:
    shared, own = statements(ledger_schema="led"), statements(ledger_schema="led", in_task=True)
    digest = hashlib.sha1(shared.spec.name.encode()).hexdigest()[:16]
    assert text(shared.names.stage) == f'"led"."sink_stage_{digest}"'
    assert text(own.names.stage) == '"pg_temp"."sink_task"'
    assert text(shared.create_stage()).count("CREATE UNLOGGED TABLE") == 1
    assert 'CREATE TEMP TABLE "pg_temp"."sink_task" ON COMMIT DROP' in text(own.create_stage(7))
    # A task's rows are its attempt's by a constant default; the shared stage's by each stager's setting.
    assert text(own.create_stage(7)).endswith("ALTER COLUMN _attempt SET DEFAULT 7::bigint")
    assert text(shared.create_stage()).endswith("SET DEFAULT current_setting('outbox_sink.attempt')::bigint")


def test_the_ledger_dead_letters_and_outbox_live_in_the_ledger_schema() -> None:
    names = Names.of(statements(schema="app", ledger_schema="led").spec)
    assert text(names.target) == '"app"."orders"'
    assert text(names.progress) == f'"led"."{tables.SINK_PROGRESS}"'
    assert text(names.dead) == f'"led"."{tables.SINK_DEAD_LETTERS}"'
    assert text(names.outbox) == f'"led"."{tables.OUTBOX_EVENTS}"'


def test_only_rows_past_the_ledger_are_fresh() -> None:
    apply = text(statements().apply(deletes=False))
    assert "count(*) FILTER (WHERE s._offset >= coalesce(p.next_offset, 0)) AS fresh" in apply
    assert "WHERE s._attempt = ANY(%(attempts)s) AND s._offset >= g.applied" in apply


def test_a_tasks_stage_found_past_the_ledger_is_read_without_it_and_only_a_tasks_can_be() -> None:
    """Every row fresh: no row-by-row join to the ledger, which still moves to the stage's ends."""
    apply = text(statements(in_task=True).past_ledger().apply(deletes=False))
    assert "JOIN" not in apply.split("deleted AS")[0]
    assert 'fresh AS NOT MATERIALIZED (SELECT * FROM "pg_temp"."sink_task")' in apply
    assert "count(*) AS fresh, max(_offset) + 1 AS next_offset" in apply
    assert "GREATEST(p.next_offset, EXCLUDED.next_offset)" in apply
    with pytest.raises(AssertionError):
        statements().past_ledger()


def test_a_task_locks_its_ledger_rows_in_one_order_after_claiming_the_missing_ones() -> None:
    st = statements(in_task=True)
    claim, lock = text(st.claim()), text(st.lock())
    assert claim.startswith(f'INSERT INTO "public"."{tables.SINK_PROGRESS}"')
    assert "ORDER BY t, p ON CONFLICT (sink, topic, kafka_partition) DO NOTHING" in claim
    assert lock.startswith("SELECT topic, kafka_partition, next_offset FROM")
    assert lock.endswith("ORDER BY topic, kafka_partition FOR UPDATE")


def test_one_statement_counts_a_keys_events_only_when_a_record_changed_nothing() -> None:
    counted, asked = text(statements().apply(deletes=False)), text(statements().apply(deletes=True))
    count = 'THEN coalesce((SELECT max(c) FROM (SELECT count(*) AS c FROM latest GROUP BY "c0") AS k), 0)'
    assert 'CASE WHEN (SELECT count(*) FROM "upserted") + (SELECT count(*) FROM "deleted")' in counted
    assert count in counted and "max(c)" not in asked
    assert asked.endswith(", 1")


def test_an_upsert_replaces_a_row_only_when_it_changes() -> None:
    apply = text(statements().apply(deletes=False))
    assert (
        'ON CONFLICT ("event_id") DO UPDATE SET "n" = EXCLUDED."n", "v" = EXCLUDED."v"'
        ' WHERE (t."n", t."v") IS DISTINCT FROM (EXCLUDED."n", EXCLUDED."v")'
    ) in apply


def test_insert_mode_never_replaces() -> None:
    apply = text(statements(mode="insert").apply(deletes=False))
    assert 'ON CONFLICT ("event_id") DO NOTHING' in apply
    assert 'ON CONFLICT ("event_id") DO UPDATE' not in apply


def test_a_version_column_keeps_the_newest_on_upsert_and_on_delete() -> None:
    apply = text(statements(version="v").apply(deletes=True))
    assert 'AND (t."v" IS NULL OR t."v" <= EXCLUDED."v")' in apply
    assert 'AND (l."c2" IS NULL OR t."v" IS NULL OR t."v" <= l."c2")' in apply


@pytest.mark.parametrize("options", [{}, {"outbox": Outbox(topic="out")}, {"trace": True}])
def test_a_batch_known_to_hold_no_delete_and_no_dead_letter_runs_neither(options: dict) -> None:
    """`deleted` and `dead` stay, empty and in their shapes, for the outbox, the trace and the counts."""
    st = statements(**options)
    lean, full = text(st.apply(deletes=False, dead_letters=False)), text(st.apply(deletes=True))
    assert "DELETE FROM" not in lean and 'DELETE FROM "public"."orders" AS t USING latest' in full
    assert "dead AS (SELECT 1 WHERE false)" in lean and "dead AS (SELECT 1 WHERE false)" not in full
    returning = full.split("deleted AS (DELETE", 1)[1].split("RETURNING ", 1)[1].split(")", 1)[0]
    assert f'deleted AS (SELECT {returning} FROM "public"."orders" AS t WHERE false)' in lean
    assert 'INSERT INTO "public"."sink_dead_letters"' in text(st.apply(deletes=False))


def test_the_outbox_gets_every_written_row_with_the_outbox_columns() -> None:
    plain, boxed = (
        text(statements().apply(deletes=False)),
        text(statements(outbox=Outbox(topic="out")).apply(deletes=False)),
    )
    assert "outboxed" not in plain and "RETURNING 1" in plain
    columns = ", ".join(f'"{c}"' for c in tables.OUTBOX_COLUMNS)
    assert f'INSERT INTO "public"."{tables.OUTBOX_EVENTS}" ({columns})' in boxed
    assert "RETURNING t.*" in boxed


@pytest.mark.parametrize("table", ["50% off", 'or"ders; DROP TABLE x; --', "note %s"])
def test_user_names_are_quoted_and_their_percent_signs_doubled(table: str) -> None:
    apply = text(statements(table).apply(deletes=False))
    quoted = '"' + table.replace('"', '""').replace("%", "%%") + '"'
    assert f'INSERT INTO "public".{quoted} AS t' in apply
    assert apply.count("%(") == apply.count("%(sink)s") + apply.count("%(attempts)s")
