"""add_event / add_events: events commit and roll back with the caller's transaction."""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
import psycopg
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from sqlalchemy.orm import Session

from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError
from outbox.writer import Event, add_event, add_events


@pytest.fixture
def db(outbox_db: DatabaseUrl, pg: psycopg.Connection) -> DatabaseUrl:
    """The migrated database with a business table of this file's own."""
    pg.execute("CREATE TABLE orders (id int PRIMARY KEY, status text)")
    return outbox_db


def outbox_rows(pg: psycopg.Connection) -> list[tuple]:
    return pg.execute(
        "SELECT event_id, topic, key, value, header_keys, header_values FROM outbox_events ORDER BY id"
    ).fetchall()


def test_psycopg_event_commits_and_rolls_back_with_the_change(
    db: DatabaseUrl, pg: psycopg.Connection
) -> None:
    with psycopg.connect(db.libpq) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1, 'paid')")
            first = add_event(
                conn, "orders", {"id": 1, "status": "paid"}, key="1", headers={"source": "shop"}
            )
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2, 'paid')")
            add_event(conn, "orders", {"id": 2}, key="2")
            raise RuntimeError("the business change fails")

    assert pg.execute("SELECT id FROM orders").fetchall() == [(1,)]
    assert outbox_rows(pg) == [(first, "orders", b"1", b'{"id":1,"status":"paid"}', ["source"], [b"shop"])]


def test_never_commits(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    with psycopg.connect(db.libpq) as conn:  # not autocommit: psycopg opens a transaction
        add_event(conn, "orders", b"raw")
        conn.rollback()
    assert outbox_rows(pg) == []


def test_autocommit_without_a_transaction_is_refused(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    with (
        psycopg.connect(db.libpq, autocommit=True) as conn,
        pytest.raises(OutboxError) as refused,
    ):
        add_event(conn, "orders", "x")
    assert refused.value.code == "OUTBOX_NO_TRANSACTION"
    assert outbox_rows(pg) == []


def test_a_sqlalchemy_autocommit_connection_is_refused(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    """Else the event commits on its own, and stays when the business change after it fails."""
    engine = sa.create_engine(db.sqlalchemy, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            with pytest.raises(OutboxError) as refused:
                add_event(conn, "orders", "x")
            assert refused.value.code == "OUTBOX_NO_TRANSACTION"
            assert "engine.begin" in refused.value.message  # the SQLAlchemy remedy
            with pytest.raises(sa.exc.IntegrityError):
                conn.execute(sa.text("INSERT INTO orders VALUES (NULL, 'fails')"))
    finally:
        engine.dispose()
    assert outbox_rows(pg) == []


def test_sqlalchemy_connection_and_session(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    engine = sa.create_engine(db.sqlalchemy)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO orders VALUES (1, 'new')"))
            a = add_event(conn, "orders", "one", key=b"\x00k")
        with Session(engine) as session:
            session.execute(sa.text("INSERT INTO orders VALUES (2, 'new')"))
            b = add_event(session, "orders", "two")
            session.rollback()
        with Session(engine) as session, session.begin():
            c = add_event(session, "orders", "three")
    finally:
        engine.dispose()
    assert [(r[0], r[3]) for r in outbox_rows(pg)] == [(a, b"one"), (c, b"three")]
    assert b not in {r[0] for r in outbox_rows(pg)}


def test_a_sqlalchemy_connection_that_commits_as_it_goes_keeps_the_event(
    db: DatabaseUrl, pg: psycopg.Connection
) -> None:
    """SQLAlchemy begins a transaction at a Connection's first statement; add_event reached the
    driver under it, so with nothing else before it SQLAlchemy had begun none: its commit() did
    nothing, and the pool rolled the event back when the connection went back to it."""
    engine = sa.create_engine(db.sqlalchemy)
    try:
        with engine.connect() as conn:
            first = add_event(conn, "orders", "one")
            conn.commit()
        with engine.connect() as conn:
            second = add_event(conn, "orders", "two")
            conn.execute(sa.text("INSERT INTO orders VALUES (1, 'new')"))
            conn.commit()
            dropped = add_event(conn, "orders", "three")
            conn.rollback()
    finally:
        engine.dispose()
    assert [r[0] for r in outbox_rows(pg)] == [first, second]
    assert dropped not in {r[0] for r in outbox_rows(pg)}


def test_an_event_without_headers_is_taken(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    with psycopg.connect(db.libpq) as conn, conn.transaction():
        [event] = add_events(conn, [Event("orders", "x", headers=None)])  # type: ignore[arg-type]
    assert outbox_rows(pg) == [(event, "orders", None, b"x", [], [])]


def test_bulk_keeps_order_ids_and_headers(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    given = uuid.uuid4()
    events = [Event("t", {"n": n}, key=str(n % 3)) for n in range(500)]
    events.append(Event("t", None, key="gone", headers=[("h", "1"), ("h", b"2")], event_id=given))
    with psycopg.connect(db.libpq) as conn, conn.transaction():
        ids = add_events(conn, events)
    rows = outbox_rows(pg)
    assert ids == [r[0] for r in rows] and ids[-1] == given
    assert [r[3] for r in rows[:500]] == [f'{{"n":{n}}}'.encode() for n in range(500)]
    assert rows[-1][2:] == (b"gone", None, ["h", "h"], [b"1", b"2"])


def test_each_row_records_its_transaction_and_rows_are_insert_only(
    db: DatabaseUrl, pg: psycopg.Connection
) -> None:
    with psycopg.connect(db.libpq) as conn, conn.transaction():
        add_events(conn, [Event("t", "a"), Event("t", "b")])
        txid = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert pg.execute("SELECT DISTINCT txid::text FROM outbox_events").fetchall() == [txid]
    with pytest.raises(psycopg.errors.RaiseException, match="insert-only"):
        pg.execute("UPDATE outbox_events SET topic = 'other'")


def test_notify_on_commit_only(db: DatabaseUrl) -> None:
    with psycopg.connect(db.libpq, autocommit=True) as listener, psycopg.connect(db.libpq) as conn:
        listener.execute("LISTEN outbox_events")
        with conn.transaction():
            add_event(conn, "t", "kept")
        with pytest.raises(RuntimeError), conn.transaction():
            add_event(conn, "t", "dropped")
            raise RuntimeError
        received = [n.payload for n in listener.notifies(timeout=2.0)]
    assert received == ["public"]


def test_notify_off_sends_none_and_lets_the_transaction_be_prepared(db: DatabaseUrl) -> None:
    """PostgreSQL refuses to PREPARE a transaction that sent a NOTIFY (two-phase commit, XA)."""
    with psycopg.connect(db.libpq, autocommit=True) as listener, psycopg.connect(db.libpq) as conn:
        listener.execute("LISTEN outbox_events")
        with conn.transaction():
            add_event(conn, "t", "two-phase", notify=False)
            add_event(conn, "t", "the same transaction")  # outbox.notify stays off for the transaction
            conn.execute("PREPARE TRANSACTION 'outbox-writer-test'")  # the block's COMMIT finds none open
        listener.execute("COMMIT PREPARED 'outbox-writer-test'")
        with conn.transaction():
            add_event(conn, "t", "a later transaction notifies again")
        received = [n.payload for n in listener.notifies(timeout=2.0)]
        rows = conn.execute("SELECT count(*) FROM outbox_events").fetchone()
    assert received == ["public"]
    assert rows == (3,)


def test_a_sqlalchemy_two_phase_transaction_adds_an_event(db: DatabaseUrl, pg: psycopg.Connection) -> None:
    engine = sa.create_engine(db.sqlalchemy)
    try:
        with engine.connect() as conn:
            two_phase = conn.begin_twophase()
            event = add_event(conn, "orders", "prepared", notify=False)
            two_phase.prepare()
            two_phase.commit()
    finally:
        engine.dispose()
    assert [r[0] for r in outbox_rows(pg)] == [event]


@pytest.mark.parametrize("value", ["maybe", "o", "0ff"])
def test_an_unknown_notify_setting_is_refused_not_taken_for_on(db: DatabaseUrl, value: str) -> None:
    with psycopg.connect(db.libpq) as conn:
        conn.execute("SELECT set_config('outbox.notify', %s, true)", [value])
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            add_event(conn, "t", "x")
    assert str(refused.value).splitlines()[0] == f"outbox.notify is '{value}': set it to on or off"


@pytest.mark.parametrize(
    ("kwargs", "code", "names"),
    [
        ({"topic": "", "value": "x"}, "OUTBOX_EVENT_TOPIC_MISSING", ""),
        ({"topic": "t", "value": object()}, "OUTBOX_VALUE_NOT_SERIALISABLE", ""),
        ({"topic": "t", "value": "x", "key": 5}, "OUTBOX_FIELD_NOT_BYTES", "the key "),
        ({"topic": "t", "value": "x", "headers": {"h": 1}}, "OUTBOX_FIELD_NOT_BYTES", "the header 'h' "),
        ({"topic": "t", "value": "x", "headers": {"event_id": "e"}}, "OUTBOX_HEADER_RESERVED", "'event_id'"),
        # Stored, these halted the relay (a topic that can never exist, its poison) or aborted the
        # caller's transaction with a raw error, instead of one line here.
        ({"topic": b"orders", "value": "x"}, "OUTBOX_EVENT_TOPIC_NOT_TEXT", "bytes"),
        ({"topic": "or ders", "value": "x"}, "OUTBOX_EVENT_TOPIC_INVALID", "'or ders'"),
        ({"topic": "ord\x00ers", "value": "x"}, "OUTBOX_EVENT_TOPIC_INVALID", "'ord\\x00ers'"),
        ({"topic": "t" * 250, "value": "x"}, "OUTBOX_EVENT_TOPIC_INVALID", "249"),
        ({"topic": "..", "value": "x"}, "OUTBOX_EVENT_TOPIC_INVALID", "'..'"),
        ({"topic": "t", "value": {"x": float("nan")}}, "OUTBOX_VALUE_NOT_SERIALISABLE", "float"),
        ({"topic": "t", "value": "x", "key": "k\udc80"}, "OUTBOX_FIELD_NOT_UTF8", "the key "),
        ({"topic": "t", "value": "\udc80"}, "OUTBOX_FIELD_NOT_UTF8", "the value "),
        ({"topic": "t", "value": "x", "headers": {"h\x00": "v"}}, "OUTBOX_HEADER_NAME_INVALID", "'h\\x00'"),
        (
            {"topic": "t", "value": "x", "headers": {"h\udc80": "v"}},
            "OUTBOX_HEADER_NAME_INVALID",
            "'h\\udc80'",
        ),
        ({"topic": "t", "value": "x", "event_id": "not-a-uuid"}, "OUTBOX_EVENT_ID_INVALID", "'not-a-uuid'"),
    ],
)
def test_bad_events_are_refused_before_anything_is_written(
    db: DatabaseUrl, pg: psycopg.Connection, kwargs: dict, code: str, names: str
) -> None:
    with psycopg.connect(db.libpq) as conn, conn.transaction():
        with pytest.raises(OutboxError) as refused:
            add_events(conn, [Event("t", "fine"), Event(**kwargs)])
        assert refused.value.code == code
        assert names in refused.value.message  # which field is at fault
        conn.execute("INSERT INTO orders VALUES (1, 'still usable')")
    assert outbox_rows(pg) == []


def test_an_event_given_to_add_event_is_named_and_its_value_not_shown(db: DatabaseUrl) -> None:
    """add_event(conn, Event(...)), for add_events(conn, [event]): the line showed the Event, its
    value (a card number, an address) and all, as a topic Kafka cannot take."""
    with psycopg.connect(db.libpq) as conn, conn.transaction(), pytest.raises(OutboxError) as refused:
        add_event(conn, Event("orders", {"card": "4111111111111111"}))  # type: ignore[arg-type]
    assert refused.value.code == "OUTBOX_EVENT_TOPIC_NOT_TEXT"
    assert "add_events(conn, [event])" in refused.value.message
    assert "4111" not in str(refused.value)


def test_missing_table_names_the_fix(database: DatabaseUrl) -> None:
    with psycopg.connect(database.libpq) as conn, pytest.raises(OutboxError) as missing:
        add_event(conn, "t", "x")
    assert missing.value.code == "TABLES_MISSING"
    assert "outbox db upgrade" in missing.value.message  # the fix


NAMES = st.one_of(
    st.text(st.sampled_from("aZ09._-"), min_size=0, max_size=260),
    st.text(st.characters(codec="utf-8"), max_size=12),
    st.sampled_from([".", "..", "...", "a" * 249, "a" * 250, "orders\x00", "ordérs", "a/b", "a b"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES)
def test_the_writer_takes_every_topic_name_kafka_takes_and_no_other(bootstrap: str, name: str) -> None:
    """Kafka itself is the oracle: a create it validates, and nothing is created."""
    try:
        Event(name, "x").row()
        taken = True
    except OutboxError as refused:
        assert refused.code in ("OUTBOX_EVENT_TOPIC_INVALID", "OUTBOX_EVENT_TOPIC_MISSING"), refused
        taken = False
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        # librdkafka sends a C string: a NUL would cut the name there, and say nothing
        if "\x00" in name:
            raise ValueError("a NUL in a name")
        [future] = admin.create_topics([NewTopic(name, 1, 1)], validate_only=True).values()
        future.result(30)
        valid = True
    except KafkaException as exc:
        why = exc.args[0].str()
        valid = "already exists" in why or "collides" in why  # a valid name, taken by another topic
    except (ValueError, UnicodeError):  # the client cannot send it at all
        valid = False
    assert taken == valid, (name, taken)
