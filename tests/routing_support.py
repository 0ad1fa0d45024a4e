"""Routing's tests share these: three event types, their three tables, and the per-type fold of a
topic's committed records that the tables must equal."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import psycopg

from outbox_dev.jvm import kafka_tools
from sinks.postgres import Outbox, PostgresSink, Table
from tests.cli import outbox
from tests.helpers import produce_transaction, transactional_producer
from tests.sink_support import log_ends

SCHEMA = (
    "event_id string, type string, order_id string, customer string, total decimal(12,2), payment_id string,"
    " amount decimal(12,2), version int, line_no int, sku string, qty int"
)
TABLES = (
    "CREATE TABLE orders (order_id text PRIMARY KEY, customer text NOT NULL, total numeric(12,2),"
    " event_id text);"
    " CREATE TABLE payments (payment_id text PRIMARY KEY, order_id text NOT NULL,"
    " amount numeric(12,2) CHECK (amount > 0), version int, event_id text);"
    " CREATE TABLE order_lines (order_id text, line_no int, sku text, qty int, event_id text,"
    " PRIMARY KEY (order_id, line_no))"
)
# Each type's table, its key and the fields it keeps, as the fold reads them.
FOLDS = {
    "OrderCreated": ("orders", ("order_id",), ("customer", "total")),
    "OrderPaid": ("payments", ("payment_id",), ("order_id", "amount", "version")),
    "LineAdded": ("order_lines", ("order_id", "line_no"), ("sku", "qty")),
}


# With `outboxed`, each change a table takes writes one outbox event naming the input event.
CHANGES = Outbox(topic="shop-changes", key="written.order_id", headers={"event": "written.event_id"})


def routed_sink(url: str, name: str = "shop", outboxed: bool = False, **keywords: Any) -> PostgresSink:
    box = CHANGES if outboxed else None
    tables = {
        "OrderCreated": Table("orders", key="order_id", outbox=box),
        "OrderPaid": Table("payments", key="payment_id", version="version", outbox=box),
        "LineAdded": Table("order_lines", key=("order_id", "line_no"), delete=None, outbox=box),
    }
    return PostgresSink.routed("type", tables, name=name, url=url, **keywords)


def created(order: str, customer: str, total: str = "10.00") -> dict[str, Any]:
    return _event(type="OrderCreated", order_id=order, customer=customer, total=total)


def paid(payment: str, order: str, amount: str, version: int) -> dict[str, Any]:
    return _event(type="OrderPaid", payment_id=payment, order_id=order, amount=amount, version=version)


def line(order: str, n: int, sku: str, qty: int) -> dict[str, Any]:
    return _event(type="LineAdded", order_id=order, line_no=n, sku=sku, qty=qty)


def _event(**fields: Any) -> dict[str, Any]:
    return {"event_id": str(uuid.uuid4()), **fields}


def record(body: dict[str, Any]) -> tuple[bytes, bytes]:
    return (body.get("order_id") or "").encode(), json.dumps(body).encode()


def shop(count: int) -> list[dict[str, Any]]:
    """`count` orders, each created, given two lines (one edited), and paid twice (a newer version,
    then the older one again: stale)."""
    events: list[dict[str, Any]] = []
    for n in range(count):
        order = str(uuid.uuid4())
        events += [
            created(order, f"c{n}"),
            line(order, 1, "apple", 1),
            line(order, 2, "pear", 2),
            line(order, 1, "apple", 3),
            paid(f"p-{order}", order, "10.00", 2),
            paid(f"p-{order}", order, "9.00", 1),
        ]
    return events


def fold(bodies: list[dict[str, Any]]) -> dict[str, dict[tuple, tuple]]:
    """Each table as the events, applied one by one in order, leave it: the latest per key, and
    for payments the highest version."""
    tables: dict[str, dict[tuple, tuple]] = {t: {} for t, _, _ in FOLDS.values()}
    for body in bodies:
        if body.get("type") not in FOLDS:
            continue
        name, key, fields = FOLDS[body["type"]]
        k = tuple(str(body[c]) for c in key)
        row = tuple(_typed(c, body.get(c)) for c in fields)
        old = tables[name].get(k)
        if name == "payments" and old is not None and old[2] is not None and row[2] < old[2]:
            continue  # stale: an older version than the row's
        tables[name][k] = row
    return tables


def _typed(column: str, value: Any) -> Any:
    return Decimal(value) if column in ("total", "amount") and value is not None else value


def read_tables(pg: psycopg.Connection) -> dict[str, dict[tuple, tuple]]:
    out: dict[str, dict[tuple, tuple]] = {}
    for name, key, fields in FOLDS.values():
        rows = pg.execute(f"SELECT {', '.join(key)}, {', '.join(fields)} FROM {name}").fetchall()
        out[name] = {tuple(str(v) for v in r[: len(key)]): tuple(r[len(key) :]) for r in rows}
    return out


def committed_bodies(bootstrap: str, topic: str) -> tuple[list[dict[str, Any]], int]:
    """The topic's committed records as Kafka's own console consumer reads them (read_committed),
    in order per partition: their bodies, and how many are no JSON."""
    bodies, poison = [], 0
    read = kafka_tools.console_consume(bootstrap, topic, expected=True)
    for r in sorted(read, key=lambda r: (r.partition, r.offset)):
        try:
            bodies.append(json.loads(r.value or ""))
        except json.JSONDecodeError:
            poison += 1
    return bodies, poison


def differences(pg: psycopg.Connection, bodies: list[dict[str, Any]]) -> list[str]:
    """Where each table differs from the fold of `bodies`: one line per key, none when equal."""
    found, wanted = read_tables(pg), fold(bodies)
    lines = []
    for name, rows in wanted.items():
        for key in sorted(rows.keys() | found[name].keys()):
            if rows.get(key) != found[name].get(key):
                lines.append(f"{name} {key}: the fold {rows.get(key)}, the table {found[name].get(key)}")
    return lines


def produce_shop(bootstrap: str, topic: str, orders: int) -> int:
    """`orders` orders' events (each one a change to its table), keyed by order, in transactions of
    60; then an aborted transaction, and 5 events of a type no table takes, whose count it returns."""
    events: list[dict[str, Any]] = []
    for n in range(orders):
        order = str(uuid.uuid4())
        payment = f"p-{order}"
        events += [
            created(order, f"c{n}"),
            line(order, 1, "apple", 1),
            line(order, 2, "pear", 2),
            line(order, 1, "apple", 3),
            paid(payment, order, "9.00", 1),
            paid(payment, order, "10.00", 2),
        ]
    producer = transactional_producer(bootstrap)
    for start in range(0, len(events), 60):
        produce_transaction(producer, topic, [record(b) for b in events[start : start + 60]])
    ghosts = [record(created(str(uuid.uuid4()), "ghost")) for _ in range(20)]
    produce_transaction(producer, topic, ghosts, commit=False)
    strays = [record(_event(type="OrderShipped", order_id=str(uuid.uuid4()))) for _ in range(5)]
    produce_transaction(producer, topic, strays)
    return len(strays)


# The input events the sink says it took: one outbox event per change, and the dead letters.
APPLIED_SQL = (
    "SELECT convert_from(header_values[1], 'UTF8') FROM outbox_events"
    " UNION ALL SELECT convert_from(value, 'UTF8')::jsonb ->> 'event_id' FROM sink_dead_letters"
)


def check_routed(pg: psycopg.Connection, bootstrap: str, topic: str, url: str, strays: int) -> None:
    """Every committed event applied once, by two readers: each table equals the per-type fold of
    the topic as Kafka's console consumer (read_committed) reads it, and `outbox verify` finds every
    committed event among those the sink took (one change each, or a dead letter), none missing,
    none leaked, none twice."""
    bodies, poison = committed_bodies(bootstrap, topic)
    assert poison == 0
    assert differences(pg, bodies) == []
    ends = {p: o for p, o in pg.execute("SELECT kafka_partition, next_offset FROM sink_progress").fetchall()}
    assert ends == log_ends(bootstrap, topic)
    took = [e for (e,) in pg.execute(APPLIED_SQL).fetchall()]
    assert len(took) == len(set(took)) == len(bodies)
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (strays,)
    said = outbox(
        *("verify", topic, "--bootstrap-servers", bootstrap, "--id-field", "event_id"),
        *("--url", url, "--source-sql", APPLIED_SQL, "--json"),
    )
    verdict = json.loads(said.out.strip().splitlines()[-1])
    assert verdict["records"] == len(bodies) and not verdict["findings"], said
