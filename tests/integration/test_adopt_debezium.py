"""`outbox db adopt-debezium`: an application written for Debezium's outbox, unchanged, published
by the relay as Debezium's EventRouter publishes it; Debezium itself, on the same transactions in
the same run, is the judge of every record's topic, partition, key, value and headers."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from psycopg import sql

from outbox import debezium
from outbox.core.committed import read_committed as read_topic
from outbox.core.config import DatabaseUrl
from outbox.core.sqltext import bindable
from outbox.relay.poison import unpublishable
from outbox.relay.row import Row
from outbox_dev.debezium import Debezium
from tests.cli import assert_one_line_error, outbox
from tests.helpers import create_topic, unique, wait_for
from tests.relay_support import relay_job, terminate

pytestmark = pytest.mark.timeout(300)

TABLE = "app_outbox"
PARTITIONS = 2
CONTEXT = "__debezium.context."
STRINGS = "org.apache.kafka.connect.storage.StringConverter"
Records = dict[tuple[str, int], list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]]


def debezium_layout(pg: psycopg.Connection) -> None:
    """The table as Debezium's outbox documentation has it."""
    pg.execute(
        sql.SQL(
            "CREATE TABLE {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,"
            " aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
        ).format(sql.Identifier(TABLE))
    )


def application(pg: psycopg.Connection, kinds: tuple[str, str]) -> int:
    """What an application written for Debezium does: rows kept, rows deleted in their own
    transaction, several rows in one statement, a COPY, a null payload, text beyond ASCII.
    Returns how many rows were inserted."""
    order, customer = kinds
    insert = sql.SQL(
        "INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s)"
    )
    table = sql.Identifier(TABLE)
    rows = 0

    def one(conn: psycopg.Connection, kind: str, aggregate: str, event: str, payload: object) -> uuid.UUID:
        nonlocal rows
        rows += 1
        event_id = uuid.uuid4()
        conn.execute(insert.format(table), [event_id, kind, aggregate, event, json.dumps(payload)])
        return event_id

    with pg.transaction():
        for n in range(6):
            one(pg, order, f"order-{n}", "OrderCreated", {"order": n, "total": n * 1.5})
        one(pg, customer, "customer-1", "CustomerCreated", {"name": "Zoë Ærø", "tags": ["ü", "€"]})
    with pg.transaction():  # the Debezium idiom: the row goes as soon as it is written
        gone = one(pg, order, "order-1", "OrderPaid", {"order": 1})
        pg.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), [gone])
    with pg.transaction():
        values = [(uuid.uuid4(), order, f"order-{n}", "LineAdded", json.dumps({"line": n})) for n in range(5)]
        pg.execute(
            sql.SQL("INSERT INTO {} (id, aggregatetype, aggregateid, type, payload) VALUES {}").format(
                table, sql.SQL(", ").join(sql.SQL("(%s, %s, %s, %s, %s)") for _ in values)
            ),
            [v for row in values for v in row],
        )
        rows += len(values)
    with (
        pg.transaction(),
        pg.cursor().copy(
            sql.SQL("COPY {} (id, aggregatetype, aggregateid, type, payload) FROM STDIN").format(table)
        ) as copy,
    ):
        for n in range(8):
            copy.write_row((uuid.uuid4(), customer, f"customer-{n % 3}", "Visited", json.dumps({"visit": n})))
            rows += 1
    with pg.transaction():
        one(pg, order, "order-2", "OrderCancelled", None)
    return rows


def records(bootstrap: str, topics: dict[str, str]) -> Records:
    """Each topic's committed records by partition, in order, under the name the judge gave it."""
    found: Records = {}
    for name, topic in topics.items():
        for m in read_topic({"bootstrap.servers": bootstrap}, topic, timeout=30):
            found.setdefault((name, m.partition()), []).append((m.key(), m.value(), list(m.headers() or [])))
    return found


def count(found: Records) -> int:
    return sum(len(v) for v in found.values())


@pytest.fixture
def kinds(bootstrap: str) -> Iterator[tuple[str, str]]:
    """Two aggregate types, each with its topic for the relay and one for Debezium (prefixed)."""
    suffix = uuid.uuid4().hex[:6]
    pair = (f"Order{suffix}", f"Customer{suffix}")
    for kind in pair:
        for prefix in ("", "dbz."):
            create_topic(bootstrap, f"{prefix}outbox.event.{kind}", partitions=PARTITIONS)
    yield pair


def test_the_relay_publishes_what_debeziums_event_router_publishes_from_the_same_transactions(
    db: DatabaseUrl, pg: psycopg.Connection, bootstrap: str, env: dict[str, str], kinds, tmp_path: Path
) -> None:
    debezium_layout(pg)
    adopted = outbox(
        "db",
        "adopt-debezium",
        TABLE,
        "--set",
        "table.fields.additional.placement=type:header:eventType",
        env=env,
    )
    assert adopted.code == 0, adopted
    assert "topic outbox.event.<aggregatetype>, key aggregateid, value payload" in adopted.out

    # Debezium as its users run it: the router's defaults, strings in and out; its topics renamed
    # after the router (dbz.), so that both publishers' records stand side by side.
    judge = Debezium(
        tmp_path / "debezium",
        db,
        bootstrap,
        [f"public.{TABLE}"],
        {
            "transforms": "outbox,apart",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.table.fields.additional.placement": "type:header:eventType",
            "transforms.apart.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.apart.regex": "(.*)",
            "transforms.apart.replacement": "dbz.$1",
        },
        worker_settings={"key.converter": STRINGS, "value.converter": STRINGS},
    )
    try:
        judge.start()
        inserted = application(pg, kinds)
        theirs_topics = {k: f"dbz.outbox.event.{k}" for k in kinds}
        wait_for(lambda: count(records(bootstrap, theirs_topics)) >= inserted, 120, "Debezium's records")
    finally:
        judge.drop_slot()

    job, _ = relay_job(tmp_path, env, unique("adopted"), "--event-id-header", "id")
    ours_topics = {k: f"outbox.event.{k}" for k in kinds}
    try:
        wait_for(lambda: count(records(bootstrap, ours_topics)) >= inserted, 60, "the relay's records")
    finally:
        terminate(job)

    theirs, ours = records(bootstrap, theirs_topics), records(bootstrap, ours_topics)
    assert count(theirs) == inserted, theirs
    # Debezium 3.6 stamps each record with its own process too (`extended.headers.enabled`):
    # about the connector, not the event; the relay has no such headers. Only those are set aside.
    own = {
        name for batch in theirs.values() for _, _, h in batch for name, _ in h if name.startswith(CONTEXT)
    }
    assert own == {CONTEXT + n for n in ("connectorLogicalName", "taskId", "connectorName", "runId")}
    assert ours == {
        at: [(k, v, [(n, b) for n, b in h if not n.startswith(CONTEXT)]) for k, v, h in batch]
        for at, batch in theirs.items()
    }
    headers = [dict(h) for batch in ours.values() for _, _, h in batch]
    assert all(set(h) == {"id", "eventType"} for h in headers), headers


def test_undo_takes_the_trigger_away_and_rows_stay_the_applications(
    db: DatabaseUrl, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    debezium_layout(pg)
    assert outbox("db", "adopt-debezium", TABLE, env=env).code == 0
    undone = outbox("db", "adopt-debezium", TABLE, "--undo", env=env)
    assert undone.code == 0 and "trigger taken away" in undone.out, undone
    pg.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, 'Order', 'o-1', 'OrderCreated', '{{}}')").format(
            sql.Identifier(TABLE)
        ),
        [uuid.uuid4()],
    )
    assert pg.execute("SELECT count(*) FROM outbox_events").fetchone() == (0,)
    again = outbox("db", "adopt-debezium", TABLE, "--undo", env=env)
    assert again.code == 0 and "nothing changed" in again.out, again


@pytest.mark.parametrize(
    ("setup", "flags", "fragments"),
    [
        ("", [], ("no table public.app_outbox",)),
        (
            "(id uuid, aggregatetype text, payload jsonb)",
            [],
            ("no column 'aggregateid'", "table.field.event.key"),
        ),
        (
            "(id text, aggregatetype text, aggregateid text, payload jsonb)",
            [],
            ("app_outbox.id is of type text", "uuid"),
        ),
        (
            "(id uuid, aggregatetype text, aggregateid text, payload jsonb, at timestamptz)",
            ["--set", "table.fields.additional.placement=at:header"],
            ("app_outbox.at is of type timestamp with time zone",),
        ),
        (
            "(id uuid, aggregatetype text, aggregateid text, payload jsonb, type text)",
            ["--set", "table.fields.additional.placement=type:envelope:eventType"],
            ("'type:envelope:eventType'", "only COLUMN:header"),
        ),
        (
            "(id uuid)",
            ["--set", "route.topic.regex=(.*)"],
            ("'route.topic.regex'", "route.topic.replacement"),
        ),
        ("(id uuid)", ["--set", "route.by.field"], ("OPTION=VALUE", "'route.by.field'")),
    ],
)
def test_what_adopt_cannot_map_is_refused_in_one_line_and_changes_nothing(
    db: DatabaseUrl,
    pg: psycopg.Connection,
    env: dict[str, str],
    setup: str,
    flags: list[str],
    fragments: tuple[str, ...],
) -> None:
    if setup:
        pg.execute(sql.SQL("CREATE TABLE {} ").format(sql.Identifier(TABLE)) + sql.SQL(setup))
    refused = outbox("db", "adopt-debezium", TABLE, *flags, env=env)
    assert_one_line_error(refused, *fragments)
    assert pg.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_adopt_debezium'"
    ).fetchone() == (0,)


NAMES = st.one_of(  # at most 63 bytes: PostgreSQL cuts longer names
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=15),
    st.sampled_from(['a"b', "50%", "$fn$", "$$", "Upper Case", "ünï", "new", "NEW.x", "'; DROP TABLE x; --"]),
)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)


@settings(
    max_examples=int(os.environ.get("ADOPT_EXAMPLES", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    names=st.lists(NAMES, min_size=6, max_size=6, unique=True),
    prefix=st.sampled_from(["", "outbox.event.", "a-$", "x"]),
    route=TEXT,
    key=TEXT,
    kind=TEXT,
)
def test_any_names_and_values_are_mapped_as_the_router_maps_them(
    db: DatabaseUrl, pg: psycopg.Connection, names: list[str], prefix: str, route: str, key: str, kind: str
) -> None:
    table, event_id, by, aggregate, payload, header = names
    # The placement's syntax, as Debezium reads it: items split at ',' and ':', trimmed.
    assume(header == header.strip() and "," not in header and ":" not in header)
    pg.execute("DELETE FROM outbox_events")
    pg.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    pg.execute(
        sql.SQL("CREATE TABLE {} ({} uuid, {} text, {} text, {} jsonb, {} varchar)").format(
            *map(sql.Identifier, names)
        )
    )
    router = debezium.Router.of(
        {
            "table.field.event.id": event_id,
            "route.by.field": by,
            "table.field.event.key": aggregate,
            "table.field.event.payload": payload,
            "route.topic.replacement": prefix + debezium.ROUTED,
            "table.fields.additional.placement": f"{header}:header:h{header}",
        }
    )
    debezium.install(pg, "public", table, "public", router)
    row_id = uuid.uuid4()
    pg.execute(
        bindable(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s)").format(sql.Identifier(table))),
        [row_id, route, key, json.dumps({"k": key}), kind],
    )
    found = pg.execute(
        "SELECT event_id, topic, key, value, header_keys, header_values FROM outbox_events"
    ).fetchall()
    value = pg.execute("SELECT %s::jsonb::text", [json.dumps({"k": key})]).fetchone()[0]
    assert found == [(row_id, prefix + route, key.encode(), value.encode(), [f"h{header}"], [kind.encode()])]


def test_a_row_with_no_aggregate_type_gets_a_topic_the_relay_refuses_by_name(
    db: DatabaseUrl, pg: psycopg.Connection
) -> None:
    pg.execute(
        sql.SQL("CREATE TABLE {} (id uuid, aggregatetype text, aggregateid text, payload jsonb)").format(
            sql.Identifier(TABLE)
        )
    )
    debezium.install(pg, "public", TABLE, "public", debezium.Router.of({}))
    pg.execute(
        sql.SQL("INSERT INTO {} VALUES (%s, NULL, 'o-1', '{{}}')").format(sql.Identifier(TABLE)),
        [uuid.uuid4()],
    )
    (topic,) = pg.execute("SELECT topic FROM outbox_events").fetchone()
    assert topic == "outbox.event.${routedByValue}"
    found = unpublishable([Row(1, b"e", topic, None, None, None, None, 0.0)], "positions")
    assert found is not None and f"topic {topic!r} is no name Kafka takes" in found[1]


def test_a_downgrade_that_would_drop_the_table_an_adopted_one_feeds_is_refused_until_undone(
    db: DatabaseUrl, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    """Dropped under the trigger, outbox_events would fail every insert of the application."""
    debezium_layout(pg)
    assert outbox("db", "adopt-debezium", TABLE, env=env).code == 0
    refused = outbox("db", "downgrade", "base", "--force", env=env)
    assert_one_line_error(refused, "public.app_outbox copy each inserted row into public.outbox_events")
    assert f"outbox db adopt-debezium {TABLE} --table-schema public --undo" in refused.err
    assert pg.execute("SELECT to_regclass('outbox_events') IS NOT NULL").fetchone() == (True,)
    assert outbox("db", "adopt-debezium", TABLE, "--undo", env=env).code == 0
    assert outbox("db", "downgrade", "base", "--force", env=env).code == 0
    assert pg.execute("SELECT to_regclass('outbox_events') IS NULL").fetchone() == (True,)


def test_a_relay_naming_the_event_id_header_otherwise_than_the_router_says_so(
    db: DatabaseUrl, pg: psycopg.Connection, env: dict[str, str], tmp_path: Path
) -> None:
    debezium_layout(pg)
    assert outbox("db", "adopt-debezium", TABLE, env=env).code == 0
    job, _ = relay_job(tmp_path, env, unique("plain"))
    job.wait_for_output("public.app_outbox feed this outbox as Debezium's EventRouter maps them", 60)
    assert "run it with --event-id-header id" in job.output()
    assert terminate(job) == 0


@pytest.mark.parametrize("undo", [False, True])
def test_adopt_behind_an_open_transaction_on_the_table_gives_up_at_its_lock_timeout(
    db: DatabaseUrl, pg: psycopg.Connection, env: dict[str, str], undo: bool
) -> None:
    """An application's transaction that wrote a row and is still open (or, to undo, one that only
    read the table, psql's `BEGIN; SELECT`): the trigger's DDL waits --lock-timeout, not for ever
    (every insert would queue behind it), then says so in one line and changes nothing."""
    debezium_layout(pg)
    if undo:
        assert outbox("db", "adopt-debezium", TABLE, env=env).code == 0
    with psycopg.connect(db.raw) as app:
        if undo:
            app.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(sql.Identifier(TABLE)))
        else:
            app.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, 'Order', 'o-1', 'OrderCreated', '{{}}')").format(
                    sql.Identifier(TABLE)
                ),
                [uuid.uuid4()],
            )
        flags = ["--undo"] if undo else []
        done = outbox("db", "adopt-debezium", TABLE, *flags, "--lock-timeout", "0.5", env=env)
        said = ("[ADOPT_LOCK_TIMEOUT]", f"waited 0.5s for public.{TABLE}", "--lock-timeout")
        assert_one_line_error(done, *said)
    assert debezium.installed(pg, "public", TABLE) == undo
    functions = pg.execute("SELECT count(*) FROM pg_proc WHERE proname LIKE %s", [f"{debezium.TRIGGER}_%"])
    assert functions.fetchone() == (1 if undo else 0,)


def test_no_other_role_may_hang_the_adopted_function_on_a_table_of_its_own(
    db: DatabaseUrl, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    """The function writes into outbox_events as its owner: a role that may create a table but has
    no grant on outbox_events cannot put it on a table of its own; the application's role, with
    INSERT on the adopted table alone, still has its rows copied."""
    debezium_layout(pg)
    assert outbox("db", "adopt-debezium", TABLE, env=env).code == 0
    (name,) = pg.execute("SELECT proname FROM pg_proc WHERE proname LIKE %s", [f"{debezium.TRIGGER}_%"])
    function = sql.Identifier("public", name[0])
    intruder, app = unique("intruder"), unique("app")
    for role in (intruder, app):
        pg.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    pg.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(intruder)))
    pg.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(TABLE), sql.Identifier(app)))
    with psycopg.connect(db.raw, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(intruder)))
        conn.execute(
            "CREATE TEMP TABLE mine (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb)"
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for function"):
            sneak = sql.SQL("CREATE TRIGGER sneak AFTER INSERT ON mine FOR EACH ROW EXECUTE FUNCTION {}()")
            conn.execute(sneak.format(function))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(app)))
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'Order', 'o-1', 'OrderCreated', '{{}}')").format(
                sql.Identifier(TABLE)
            ),
            [uuid.uuid4()],
        )
    assert pg.execute("SELECT count(*) FROM outbox_events").fetchone() == (1,)
