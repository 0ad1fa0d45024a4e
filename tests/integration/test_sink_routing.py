"""PostgresSink.routed: one frame into three tables, each row's table picked by its type, on both
apply paths; every table and the one ledger in each transaction."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import psycopg
import pytest

from outbox.core.errors import ConfigError
from sinks.errors import SinkError
from sinks.postgres import Outbox, PostgresSink, Table, header, parse_json
from tests.cli import outbox
from tests.helpers import create_topic, unique
from tests.relay_support import relay_job, terminate, wait_published
from tests.routing_support import (
    SCHEMA,
    TABLES,
    created,
    differences,
    fold,
    line,
    paid,
    read_tables,
    record,
    routed_sink,
    shop,
)
from tests.sink_support import KAFKA, ledger

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def shop_db(outbox_db, pg):  # type: ignore[no-untyped-def]
    pg.execute(TABLES)
    return outbox_db


def apply(spark, sink: PostgresSink, batches: list[list[tuple[bytes | None, bytes | None]]], tasks: bool):  # type: ignore[no-untyped-def]
    """Each list of records as one micro-batch of topic "t", partition 0 (sink_support.apply_batches)."""
    offset, writer = 0, None
    for batch_id, records in enumerate(batches):
        frame = writer_frame(spark, records, offset, tasks)
        offset += len(records)
        writer = writer or sink.writer(frame)
        assert writer.route.tasks == tasks, writer.route
        writer(frame, batch_id)
    return writer


def writer_frame(spark, records: list[tuple[bytes | None, bytes | None]], offset: int, tasks: bool):  # type: ignore[no-untyped-def]
    rows = [(k, v, "t", 0, offset + i) for i, (k, v) in enumerate(records)]
    raw = spark.createDataFrame(rows, KAFKA)
    return parse_json(raw.coalesce(1) if tasks else raw, SCHEMA)


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_three_types_go_to_three_tables_as_the_per_type_fold_of_the_records(
    spark, shop_db, pg, tasks
) -> None:  # type: ignore[no-untyped-def]
    bodies = shop(6)
    strange = {"type": "OrderShipped", "order_id": str(uuid.uuid4())}
    records = [record(b) for b in bodies]
    batches = [records[:13], [*records[13:], record(strange), (b"k", b"not json")], records[:20]]
    writer = apply(spark, routed_sink(shop_db.raw), batches, tasks)

    # The last batch redelivers the first 20 events at new offsets: applied again, in order.
    assert differences(pg, bodies + bodies[:20]) == []
    dead = pg.execute("SELECT kafka_offset, error FROM sink_dead_letters ORDER BY kafka_offset").fetchall()
    assert [o for o, _ in dead] == [len(bodies), len(bodies) + 1]
    assert "routed by type: no table takes OrderShipped" in dead[0][1]
    assert ledger(pg) == {0: len(bodies) + 2 + 20}
    assert (writer.last.staged, writer.last.fresh, writer.last.ignored) == (20, 20, 0)

    writer(writer_frame(spark, batches[2], len(bodies) + 2, tasks), 2)  # batch 2 run again: a replay
    assert differences(pg, bodies + bodies[:20]) == []
    assert (writer.last.staged, writer.last.fresh) == (20, 0)


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_unrouted_ignore_passes_over_a_type_no_table_takes_and_the_ledger_moves_past_it(
    spark, shop_db, pg, tasks
) -> None:  # type: ignore[no-untyped-def]
    order = str(uuid.uuid4())
    bodies = [created(order, "ann"), {"type": "Unknown", "order_id": order}]
    writer = apply(spark, routed_sink(shop_db.raw, unrouted="ignore"), [[record(b) for b in bodies]], tasks)
    assert differences(pg, bodies) == []
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)
    assert ledger(pg) == {0: 2}
    assert (writer.last.upserted, writer.last.ignored) == (1, 1)


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_a_row_one_table_refuses_fails_the_batch_in_every_table(spark, shop_db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    """on_error="fail": the payments table's CHECK refuses a row, and nothing of the batch is
    applied, in the orders table either; the ledger stays where it was."""
    order = str(uuid.uuid4())
    good = [record(created(order, "ann")), record(line(order, 1, "fig", 1))]
    bad = [record(created(str(uuid.uuid4()), "bob")), record(paid("p1", order, "-1.00", 1))]
    sink = routed_sink(shop_db.raw, on_error="fail")
    with pytest.raises(SinkError, match="the table refused a row"):
        apply(spark, sink, [good, bad], tasks)
    assert read_tables(pg) == fold([created(order, "ann"), line(order, 1, "fig", 1)])
    assert ledger(pg) == {0: 2}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_create_makes_each_routed_table_from_the_fields_it_names(spark, outbox_db, pg, tasks) -> None:  # type: ignore[no-untyped-def]
    tables = {
        "OrderCreated": Table(
            "orders", key="order_id", columns=["order_id", "customer", "total"], create=True
        ),
        "LineAdded": Table(
            "order_lines",
            key=("order_id", "line_no"),
            columns=["order_id", "line_no", "sku", "qty"],
            create=True,
        ),
    }
    sink = PostgresSink.routed("type", tables, name="shop", url=outbox_db.raw)
    order = str(uuid.uuid4())
    apply(spark, sink, [[record(created(order, "ann", "3.50")), record(line(order, 2, "fig", 4))]], tasks)
    assert pg.execute("SELECT order_id, customer, total FROM orders").fetchall() == [
        (order, "ann", Decimal("3.50"))
    ]
    assert pg.execute("SELECT order_id, line_no, sku, qty FROM order_lines").fetchall() == [
        (order, 2, "fig", 4)
    ]


def test_route_by_topic(spark, shop_db, pg) -> None:  # type: ignore[no-untyped-def]
    """`by` may be any column of the frame: here Kafka's topic, one type per topic."""
    order = str(uuid.uuid4())
    rows = [
        (order.encode(), json.dumps(created(order, "ann")).encode(), "created", 0, 0),
        (order.encode(), json.dumps(line(order, 1, "fig", 2)).encode(), "lines", 0, 0),
    ]
    frame = parse_json(spark.createDataFrame(rows, KAFKA).coalesce(1), SCHEMA)
    tables = {
        "created": Table("orders", key="order_id"),
        "lines": Table("order_lines", key=("order_id", "line_no")),
    }
    writer = PostgresSink.routed("topic", tables, name="shop", url=shop_db.raw).writer(frame)
    writer(frame, 0)
    assert read_tables(pg)["orders"] == {(order,): ("ann", Decimal("10.00"))}
    assert read_tables(pg)["order_lines"] == {(order, "1"): ("fig", 2)}
    assert dict(
        pg.execute("SELECT topic, next_offset FROM sink_progress WHERE sink = 'shop'").fetchall()
    ) == {"created": 1, "lines": 1}


def test_route_by_header(spark, shop_db, pg) -> None:  # type: ignore[no-untyped-def]
    """`header("type")`: the value of a Kafka header; a record without it is a dead letter."""
    order = str(uuid.uuid4())
    headers = "array<struct<key: string, value: binary>>"
    rows = [
        (order.encode(), json.dumps(created(order, "ann")).encode(), "t", 0, 0, [("type", b"new")]),
        (
            order.encode(),
            json.dumps(line(order, 1, "fig", 2)).encode(),
            "t",
            0,
            1,
            [("x", b"y"), ("type", b"line")],
        ),
        (order.encode(), json.dumps(line(order, 2, "fig", 2)).encode(), "t", 0, 2, []),
    ]
    raw = spark.createDataFrame(rows, f"{KAFKA}, headers {headers}").coalesce(1)
    frame = parse_json(raw, SCHEMA)
    tables = {
        "new": Table("orders", key="order_id"),
        "line": Table("order_lines", key=("order_id", "line_no")),
    }
    writer = PostgresSink.routed(header("type"), tables, name="shop", url=shop_db.raw).writer(frame)
    writer(frame, 0)
    assert read_tables(pg)["orders"] == {(order,): ("ann", Decimal("10.00"))}
    assert read_tables(pg)["order_lines"] == {(order, "1"): ("fig", 2)}
    dead = pg.execute("SELECT kafka_offset, error FROM sink_dead_letters").fetchall()
    assert dead == [(2, "routed by the route column: no table takes null")]


def test_routing_mistakes_are_one_line_each(spark, shop_db) -> None:  # type: ignore[no-untyped-def]
    url = shop_db.raw
    frame = parse_json(spark.createDataFrame([], KAFKA), SCHEMA)
    cases = [
        (lambda: PostgresSink.routed("type", {}, name="s", url=url), "SINK_ROUTES_EMPTY"),
        (
            lambda: PostgresSink.routed("type", {"A": Table("orders", key="order_id")}, name="", url=url),
            "SINK_ROUTED_UNNAMED",
        ),
        (
            lambda: PostgresSink.routed(
                "type",
                {"A": Table("orders", key="order_id"), "B": Table("orders", key="order_id")},
                name="s",
                url=url,
            ),
            "SINK_ROUTED_TABLE_REPEATS",
        ),
        (
            lambda: PostgresSink.routed(
                "type", {"A": Table("orders", key="order_id", evolve=True)}, name="s", url=url
            ),
            "SINK_ROUTE_NEEDS_COLUMNS",
        ),
        (
            lambda: PostgresSink.routed(
                "type", {"A": Table("orders", key="order_id")}, name="s", url=url, unrouted="drop"
            ),
            "SINK_UNROUTED_NOT_A_CHOICE",
        ),  # type: ignore[arg-type]
        (
            lambda: PostgresSink.routed(
                "kind", {"A": Table("orders", key="order_id")}, name="s", url=url
            ).writer(frame),
            "SINK_ROUTE_COLUMN_ABSENT",
        ),
        (
            lambda: PostgresSink.routed(
                "type",
                {"A": Table("orders", key="order_id", columns=["order_id", "nope"])},
                name="s",
                url=url,
            ).writer(frame),
            "SINK_ROUTED_COLUMNS_ABSENT",
        ),
    ]
    for make, code in cases:
        with pytest.raises(ConfigError) as refused:
            make()
        assert refused.value.code == code
        assert "\n" not in str(refused.value)


def test_the_one_table_sink_is_unchanged_by_routing(spark, shop_db, pg: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """PostgresSink("orders", key=...) stays one lane: its ledger moves inside its statement."""
    order = str(uuid.uuid4())
    sink = PostgresSink("orders", key="order_id", url=shop_db.raw)
    rows = [(b"k", json.dumps(created(order, "ann")).encode(), "t", 0, 0)]
    frame = parse_json(
        spark.createDataFrame(rows, KAFKA).coalesce(1),
        "order_id string, customer string, total decimal(12,2)",
    )
    sink.writer(frame)(frame, 0)
    assert read_tables(pg)["orders"] == {(order,): ("ann", Decimal("10.00"))}
    assert ledger(pg) == {0: 1}


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_two_tables_events_of_one_key_in_one_batch_keep_their_own_ids_through_the_relay(  # type: ignore[no-untyped-def]
    spark, shop_db, pg, env, bootstrap, tmp_path, tasks
) -> None:
    """A routed tracing sink's tables share its name, transaction and round: each outbox event's
    id takes its table too, so an order and a payment of one key text in one batch are two events,
    each published once under its own id, and `outbox trace` finds each."""
    topic = create_topic(bootstrap, unique("shop-changes"))
    box = Outbox(topic=topic, key="written.order_id", headers={"event": "written.event_id"})
    tables = {
        "OrderCreated": Table("orders", key="order_id", outbox=box),
        "OrderPaid": Table("payments", key="payment_id", version="version", outbox=box),
    }
    sink = PostgresSink.routed("type", tables, name=unique("shop"), url=shop_db.raw, trace=True)
    apply(spark, sink, [[record(created("42", "c42")), record(paid("42", "42", "5.00", 1))]], tasks)
    ids = sorted(str(i) for (i,) in pg.execute("SELECT event_id FROM outbox_events"))
    assert len(set(ids)) == len(ids) == 2, ids
    job, _ = relay_job(tmp_path, env, unique("relay"))
    try:
        records = wait_published(bootstrap, topic, 1, 2)
    finally:
        assert terminate(job) == 0, job.output()[-3000:]
    assert sorted(event for *_, event in records) == ids
    traced = outbox("trace", "42", env={"DATABASE_URL": shop_db.raw})
    assert traced.code == 0 and all(i in traced.out for i in ids), traced
