"""Tracing: what a tracing sink records per input record, and `outbox trace` following an event through
the sink, the outbox, the relay and the output topic, on real Spark, PostgreSQL and Kafka."""

from __future__ import annotations

import csv
import json
import uuid

import hypothesis.strategies as st
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from psycopg import sql

from outbox.core.sqltext import bindable
from outbox.core.trace import key_text_sql, outbox_event_id, outbox_event_id_sql
from outbox.trace.outcomes import COLUMNS, ORDER, Record, TraceRow, records
from outbox.writer import add_event
from sinks.postgres import Outbox, PostgresSink
from tests.cli import outbox
from tests.helpers import (
    committed_messages,
    create_topic,
    produce_transaction,
    transactional_producer,
    unique,
    wait_for,
)
from tests.relay_support import ACTIVE, relay_job, terminate, wait_published
from tests.sink_support import apply_batches, event, run


def _records(pg: psycopg.Connection) -> list[Record]:
    rows = pg.execute(f"SELECT {COLUMNS} FROM sink_traces ORDER BY {ORDER}").fetchall()
    return sorted(records([TraceRow(*row) for row in rows]), key=lambda r: r.offset)


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_tracing_sink_records_each_records_outcome_with_the_rows(spark, db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    sink = PostgresSink("orders", url=db.raw, version="version", trace=True, outbox=Outbox("orders-out"))
    apply_batches(
        spark,
        sink,
        [
            [event(a, 1, "1.00", 2), event(b, 2, "1.00", 1)],  # 0, 1: applied
            [event(a, 1, "1.00", 2), event(b, 2, "1.00", 0)],  # 2: a duplicate, 3: stale
            [event(c, 3, "1.00", 1), event(c, 3, "2.00", 2), (b.encode(), None)],  # 4, 5: applied, 6: deleted
        ],
        tasks=tasks,
    )
    traced = _records(pg)
    assert [r.outcome for r in traced] == [
        "applied",
        "applied",
        "duplicate",
        "stale",
        "applied",
        "applied",
        "deleted",
    ]
    assert [r.version for r in traced] == ["2", "1", "2", "0", "1", "2", None]
    assert {(r.topic, r.partition, r.outbox_topic) for r in traced} == {("t", 0, "orders-out")}
    # Each applied record's outbox event, under the id a trace computes from what it read.
    expected = {outbox_event_id(r.sink, r.txid, r.round, r.event, r.target) for r in traced if r.wrote_outbox}
    assert {r.target for r in traced} == {"public.orders"}
    assert {r[0] for r in pg.execute("SELECT event_id FROM outbox_events")} == expected
    assert len(expected) == 5

    rows = len(pg.execute("SELECT 1 FROM sink_traces").fetchall())
    kept = outbox("trace", "--prune", "1", env={"DATABASE_URL": db.raw})
    assert (kept.code, kept.out) == (0, "deleted 0 trace row(s) older than 1 day(s)\n"), kept
    pruned = outbox("trace", "--prune", "0", env={"DATABASE_URL": db.raw})
    assert (pruned.code, pruned.out) == (0, f"deleted {rows} trace row(s) older than 0 day(s)\n"), pruned
    assert _records(pg) == []


def test_outbox_trace_follows_events_from_input_record_to_output_topic(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, checkpoint, tmp_path, env
) -> None:
    out = create_topic(bootstrap, unique("out"), partitions=3)  # some with nothing after the event
    a, b, d, never = (str(uuid.uuid4()) for _ in range(4))
    refused = (d.encode(), json.dumps({"event_id": d, "n": None, "amount": "1.00", "version": 1}).encode())
    produce_transaction(
        transactional_producer(bootstrap),
        topic,
        [
            event(a, 1, "1.00", 2),
            event(b, 2, "1.00", 1),
            event(a, 1, "1.00", 2),
            event(b, 2, "1.00", 0),
            refused,
        ],
        partition=0,
    )
    sink = PostgresSink(
        "orders", url=db.raw, version="version", trace=True, outbox=Outbox(out, key="written.event_id::text")
    )
    run(spark, bootstrap, topic, checkpoint, sink)
    [first] = [r for r in _records(pg) if r.offset == 0]
    a_box = str(outbox_event_id(first.sink, first.txid, first.round, a, first.target))

    # Before any relay ran: a's outbox event waits in the outbox.
    waiting = outbox("trace", a, env={"DATABASE_URL": db.raw})
    assert waiting.code == 0, waiting
    said = waiting.out.splitlines()
    assert said[0] == f"event {a}: 2 input record(s), 0 dead letter(s)"
    assert said[1].startswith(f"  input {topic}[0]@0: sink public.orders applied at version 2, ")
    assert said[2].startswith(f"    outbox event {a_box} for {out}:")
    assert "waiting in the outbox since" in said[2]
    assert said[3].startswith(f"  input {topic}[0]@2: sink public.orders skipped: a duplicate")
    assert said[4] == "  (give --bootstrap-servers to find the outbox events in Kafka)"
    assert len(said) == 5, waiting.out

    # A stale version, and a row the table refused (n is NOT NULL), which a sink dead letter holds.
    stale = json.loads(outbox("trace", b.upper(), "--json", env={"DATABASE_URL": db.raw}).out)
    assert [(r["offset"], r["outcome"], r["version"]) for r in stale["records"]] == [
        (1, "applied", "1"),
        (3, "stale", "0"),
    ]
    stale_said = outbox("trace", b, env={"DATABASE_URL": db.raw}).out
    assert f"\n  input {topic}[0]@1: sink public.orders applied at version 1, " in stale_said, stale_said
    assert f"\n  input {topic}[0]@3: sink public.orders skipped: a stale version" in stale_said, stale_said
    dead = outbox("trace", d, env={"DATABASE_URL": db.raw})
    assert dead.code == 0, dead
    assert f"  input {topic}[0]@4: sink public.orders dead-lettered it, " in dead.out
    assert "null value in column" in dead.out
    dead_json = json.loads(outbox("trace", d, "--json", env={"DATABASE_URL": db.raw}).out)
    assert dead_json["records"] == [] and dead_json["found"], dead_json
    [letter] = dead_json["dead_letters"]
    assert (letter["partition"], letter["offset"]) == (0, 4) and "null value in column" in letter["error"]
    unknown = outbox("trace", never, env={"DATABASE_URL": db.raw})
    assert unknown.code == 1 and "no record of it" in unknown.out, unknown

    # A relay publishes; the trace then finds a's event in the output topic.
    relay = unique("relay")  # keeps published rows: the last part reads them
    job, _ = relay_job(tmp_path, {**env, "DATABASE_URL": db.raw}, relay, "--retention", "3600")
    try:
        job.wait_for_output(ACTIVE, 60)
        [(partition, offset, _, published_id)] = [
            r for r in wait_published(bootstrap, out, 3, 2) if r[3] == a_box
        ]
        found = json.loads(
            outbox(
                "trace", a, "--json", env={"DATABASE_URL": db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
            ).out
        )
    finally:
        assert terminate(job) == 0, job.output()
    box = found["records"][0]["outbox"]
    assert box["state"] == "published" and box["event_id"] == published_id
    assert (box["published"]["partition"], box["published"]["offset"]) == (partition, offset)
    duplicate = found["records"][1]
    assert (duplicate["offset"], duplicate["outcome"]) == (2, "duplicate")
    assert duplicate["outbox"] is None  # a duplicate wrote no outbox event
    human = outbox("trace", a, "--bootstrap-servers", bootstrap, env={"DATABASE_URL": db.raw})
    assert f"published as {out}[{partition}]@{offset} at " in human.out, human.out

    # A relay records how far it got in PostgreSQL about once a second; one killed -9 between its
    # Kafka commit and that record leaves PostgreSQL behind (as make demo found). Kafka decides.
    before_a = f"{first.txid}:{first.txid}:"  # a snapshot that does not see a's transaction
    pg.execute("UPDATE relay_positions SET base = %s WHERE relay = %s", [before_a, relay])
    behind = json.loads(outbox("trace", a, "--json", env={"DATABASE_URL": db.raw}).out)
    assert behind["records"][0]["outbox"]["state"] == "waiting", behind
    assert behind["searched"] == "give --bootstrap-servers to find the outbox events in Kafka", behind
    kafka = ["--bootstrap-servers", bootstrap]
    found = json.loads(outbox("trace", a, "--json", *kafka, env={"DATABASE_URL": db.raw}).out)
    box = found["records"][0]["outbox"]
    assert box["state"] == "published", box
    assert (box["published"]["partition"], box["published"]["offset"]) == (partition, offset)


def test_keys_of_several_columns_are_told_apart_when_a_column_holds_a_comma(spark, db, pg) -> None:  # type: ignore[no-untyped-def]
    """('x,y', 'z') and ('x', 'y,z') are two rows: two outbox events (the ids a consumer dedupes on)
    and a trace each. Joined with ',' alone both were the event 'x,y,z': one id for both events."""
    pg.execute("CREATE TABLE pairs (a text, b text, n bigint NOT NULL, PRIMARY KEY (a, b))")
    sink = PostgresSink("pairs", url=db.raw, key=["a", "b"], trace=True, outbox=Outbox("pairs-out"))
    rows = [("x,y", "z", 1), ("x", "y,z", 2), ('say "hi"', "", 3)]
    apply_batches(
        spark,
        sink,
        [[(None, json.dumps({"a": a, "b": b, "n": n}).encode()) for a, b, n in rows]],
        schema="a string, b string, n long",
        key_column=None,
    )
    ids = [r[0] for r in pg.execute("SELECT event_id FROM outbox_events")]
    assert len(set(ids)) == len(ids) == 3, ids
    # Each row's event is its key as a line of CSV; a trace of it finds that row's record alone.
    for offset, text in enumerate(['"x,y",z', 'x,"y,z"', '"say ""hi""",']):
        said = outbox("trace", text, "--json", env={"DATABASE_URL": db.raw})
        assert said.code == 0, said
        [record] = json.loads(said.out)["records"]
        assert record["offset"] == offset, (text, record)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


@given(sink=_TEXT, key=_TEXT, target=_TEXT, round_=st.integers(0, 2**31 - 1), txid=st.integers(3, 2**63 - 1))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_outbox_ids_python_computes_are_the_ones_postgresql_writes(
    pg, sink, key, target, round_, txid
) -> None:  # type: ignore[no-untyped-def]
    """`outbox trace` computes in Python the id the sink's SQL gave an outbox event, for any sink name,
    table name, key text and round; the transaction's id is the one the statement runs in."""
    query = sql.SQL("SELECT pg_current_xact_id()::text, {}").format(
        outbox_event_id_sql(sql.SQL("%(key)s::text"), sql.SQL("%(round)s::int"), target)
    )
    with pg.transaction():
        current, made = pg.execute(bindable(query), {"sink": sink, "key": key, "round": round_}).fetchone()
    assert made == outbox_event_id(sink, current, round_, key, target)
    by_round = (outbox_event_id(sink, str(txid), r, key, target) for r in (round_, round_ + 1))
    assert len(set(by_round)) == 2


@given(key=st.lists(_TEXT, min_size=2, max_size=4))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_key_of_several_columns_is_one_line_of_csv_that_reads_back_as_its_columns(pg, key) -> None:  # type: ignore[no-untyped-def]
    """The event of a key of several columns reads back as those columns, whatever they hold, so no
    two keys share an event (and an outbox event id)."""
    columns = [sql.Identifier(f"c{i}") for i in range(len(key))]
    query = sql.SQL("SELECT {} FROM (SELECT {}) AS k").format(
        key_text_sql(sql.Identifier("k"), columns),
        sql.SQL(", ").join(sql.SQL("%s::text AS {}").format(c) for c in columns),
    )
    [(text,)] = pg.execute(query, key).fetchall()
    assert next(csv.reader([text])) == key


def test_the_writers_span_goes_through_the_relay_and_the_sink_into_outbox_trace(  # type: ignore[no-untyped-def]
    spark, bootstrap, db, pg, checkpoint, tmp_path, env
) -> None:
    """An application writes events inside an OpenTelemetry span; the relay publishes them with the
    span's traceparent among their headers, unchanged; a tracing sink applies them; `outbox trace`
    names the span of each input record. An event written with trace_context=False carries none."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    topic = create_topic(bootstrap, unique("traced"), partitions=2)
    traced, untraced, own = (str(uuid.uuid4()) for _ in range(3))
    body = {"n": 1, "amount": "1.00"}
    with trace.get_tracer("test", tracer_provider=TracerProvider()).start_as_current_span("checkout") as span:
        with psycopg.connect(db.libpq) as conn:
            add_event(conn, topic, {"event_id": traced, **body}, key=traced)
            add_event(conn, topic, {"event_id": untraced, **body}, key=untraced, trace_context=False)
            given = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
            add_event(conn, topic, {"event_id": own, **body}, key=own, headers=given)
        context = span.get_span_context()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    job, _ = relay_job(tmp_path, env, unique("relay"))
    try:
        published = {m.key().decode(): dict(m.headers() or []) for m in wait_committed(bootstrap, topic, 3)}
    finally:
        assert terminate(job) == 0, job.output()
    assert published[traced]["traceparent"] == traceparent.encode()
    assert "traceparent" not in published[untraced]
    assert published[own]["traceparent"] == given["traceparent"].encode()

    run(spark, bootstrap, topic, checkpoint, PostgresSink("orders", url=db.raw, trace=True))
    said = outbox("trace", traced, "--bootstrap-servers", bootstrap, env={"DATABASE_URL": db.raw})
    assert said.code == 0, said
    assert f"    traceparent {traceparent} (its writer's span)" in said.out.splitlines(), said.out
    as_json = json.loads(outbox("trace", untraced, "--json", "--bootstrap-servers", bootstrap, env=env).out)
    assert [r["traceparent"] for r in as_json["records"]] == [None]


def wait_committed(bootstrap: str, topic: str, count: int) -> list:
    """The topic's committed records once there are `count`."""
    found: list = []

    def enough() -> bool:
        found[:] = committed_messages(bootstrap, topic, 2)
        return len(found) >= count

    wait_for(enough, 60, f"{count} records in {topic}")
    return found


def test_trace_finds_events_in_kafka_by_the_header_the_relay_named(bootstrap, topic) -> None:  # type: ignore[no-untyped-def]
    """A relay run with --event-id-header id (an outbox adopted from Debezium's) puts each id in
    header `id`: looked for in `event_id` alone, as it was, no event was ever found in Kafka."""
    import datetime as dt

    from outbox.trace import gather

    ours, other = uuid.uuid4(), uuid.uuid4()
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    producer.produce(topic, key=b"a", value=b"{}", headers=[("id", str(ours).encode())])
    producer.produce(topic, key=b"b", value=b"{}", headers=[("event_id", str(other).encode())])
    producer.commit_transaction(30)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    by_id = gather._search(bootstrap, topic, {ours, other}, since, 30, "id")
    assert set(by_id) == {ours} and (by_id[ours].partition, by_id[ours].offset) == (0, 0)
    by_default = gather._search(bootstrap, topic, {ours, other}, since, 30, gather.tables.EVENT_ID_HEADER)
    assert set(by_default) == {other}
