"""parse_avro against a real schema registry (Apicurio, Confluent's API): records written by
Confluent's own AvroSerializer, a schema that evolves mid-topic, and values that cannot be read."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.errors import StreamingQueryException

from outbox.core.errors import OutboxError
from outbox.core.registry import Registry
from sinks.postgres import PostgresSink, parse_avro
from tests.conftest import RunningRegistry
from tests.helpers import produce_transaction, transactional_producer, unique, wait_for
from tests.integration.test_connect import probe
from tests.registry_proxy import FaultyProxy
from tests.sink_support import applied_both_ways, ledger, log_ends
from tests.source_support import stream

pytestmark = pytest.mark.timeout(300)

TABLE = (
    "CREATE TABLE avro_orders (event_id uuid PRIMARY KEY, n bigint NOT NULL, amount numeric(12,2),"
    " placed timestamptz, day date, at time, status text, tags jsonb, note text)"
)
V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "n", "type": "long"},
        {
            "name": "amount",
            "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}],
        },
        {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
# v2: a field added with a default (what Avro's resolution fills in for v1's records).
V2 = {**V1, "fields": [*V1["fields"], {"name": "note", "type": "string", "default": "none"}]}


def serializer(registry: RunningRegistry, schema: dict[str, Any]) -> AvroSerializer:
    return AvroSerializer(registry.client(), json.dumps(schema))


def order(n: int, event_id: str, **more: Any) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "n": n,
        "amount": Decimal(f"{n}.25"),
        "placed": dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC) + dt.timedelta(days=n),
        "day": dt.date(1999, 12, 31) + dt.timedelta(days=n),
        "at": dt.time(23, 59, 58, 125000),
        "status": "PAID" if n % 2 else "NEW",
        "tags": [f"t{n}", "é"],
        **more,
    }


def rows(pg: psycopg.Connection) -> dict[str, tuple]:
    found = pg.execute(
        "SELECT event_id::text, n, amount, placed, day, at, status, tags, note FROM avro_orders"
    ).fetchall()
    return {r[0]: r[1:] for r in found}


def expected(record: dict[str, Any], note: str) -> tuple:
    return (
        record["n"],
        record["amount"],
        record["placed"],
        record["day"],
        record["at"],
        record["status"],
        record["tags"],
        note,
    )


def test_confluents_avro_records_of_an_evolving_schema_are_applied_once_as_the_reader_schema_says(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """v1 records, then v2 records (a field added with a default) under the same subject, written by
    Confluent's AvroSerializer; a tombstone; an aborted transaction. The reader is the subject's
    newest version: v1's records get the default, and every logical type reaches its column."""
    pg.execute(TABLE)
    producer = transactional_producer(bootstrap)
    ids = [str(uuid.uuid4()) for _ in range(40)]
    v1, v2 = serializer(registry, V1), serializer(registry, V2)
    context = SerializationContext(topic, MessageField.VALUE)

    first = [order(n, i) for n, i in enumerate(ids[:30])]
    produce_transaction(producer, topic, [(r["event_id"].encode(), v1(r, context)) for r in first])
    later = [order(n + 100, i, note=f"v2 {n}") for n, i in enumerate(ids[20:])]  # 10 edits, 10 new
    produce_transaction(producer, topic, [(r["event_id"].encode(), v2(r, context)) for r in later])
    produce_transaction(producer, topic, [(ids[0].encode(), None)])  # a tombstone
    produce_transaction(
        producer, topic, [(ids[1].encode(), v2(order(-1, ids[1], note="no"), context))], commit=False
    )

    frame = parse_avro(stream(spark, bootstrap, topic), registry.url, key_column="event_id")
    sink = PostgresSink("avro_orders", url=db.raw)
    sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination()

    want = {r["event_id"]: expected(r, "none") for r in first[1:]}
    want.update({r["event_id"]: expected(r, r["note"]) for r in later})
    assert rows(pg) == want
    assert ledger(pg) == log_ends(bootstrap, topic)
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)


def test_values_that_cannot_be_read_are_dead_letters_naming_why_and_the_rest_is_applied(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    pg.execute(TABLE)
    subject_topic = unique("avro")  # the reader schema, registered under a subject of its own
    context = SerializationContext(subject_topic, MessageField.VALUE)
    good = serializer(registry, V2)(order(7, str(uuid.uuid4()), note="ok"), context)
    schema_id = struct.unpack(">I", good[1:5])[0]
    records = [
        (b"a", json.dumps({"event_id": str(uuid.uuid4())}).encode()),  # JSON, no magic byte
        (b"b", b"\x00" + struct.pack(">I", 2_000_000) + good[5:]),  # an id the registry never gave
        (b"c", good[:12]),  # its body cut short
        (b"d", good + b"\x00\x01"),  # bytes past its record
        (b"e", good),
    ]
    produce_transaction(transactional_producer(bootstrap), topic, records)

    frame = parse_avro(
        stream(spark, bootstrap, topic), {"url": registry.url}, subject=f"{subject_topic}-value"
    )
    sink = PostgresSink("avro_orders", url=db.raw)
    sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination()

    assert len(rows(pg)) == 1
    dead = dict(pg.execute("SELECT key, error FROM sink_dead_letters").fetchall())
    assert sorted(dead) == [b"a", b"b", b"c", b"d"]
    assert "does not start with Confluent's magic byte 0" in dead[b"a"], dead[b"a"]
    assert "schema id 2000000 is not known to the schema registry" in dead[b"b"], dead[b"b"]
    assert f"the value ends inside its record of writer schema id {schema_id}: it is cut short" in dead[b"c"]
    assert f"2 bytes past its record of writer schema id {schema_id}" in dead[b"d"], dead[b"d"]


# Fields of the types the tasks read from Kafka themselves (sinks/postgres/direct.py).
PLAIN_V1 = {
    "type": "record",
    "name": "Payment",
    "namespace": "shop",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "paid", "type": "boolean"},
        {"name": "rate", "type": "double"},
    ],
}
PLAIN_V2 = {
    **PLAIN_V1,
    "fields": [*PLAIN_V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}


@pytest.mark.parametrize("source", ["kafka", "kafka_rc"])
def test_the_tasks_read_avro_from_kafka_themselves_and_apply_what_sparks_rows_apply(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, tmp_path, caplog, source
) -> None:
    """v1 and v2 records, a tombstone, an aborted transaction and values that cannot be read, applied
    once by tasks that read and decode them themselves, once from Spark's rows: the same rows, the
    same dead letters."""
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = serializer(registry, PLAIN_V1), serializer(registry, PLAIN_V2)
    ids = [str(uuid.uuid4()) for _ in range(60)]

    def payment(n: int, event_id: str, **more: Any) -> dict[str, Any]:
        return {
            "event_id": event_id,
            "n": n,
            "amount": Decimal(f"{n}.05"),
            "paid": n % 2 == 0,
            "rate": n / 7,
            **more,
        }

    producer = transactional_producer(bootstrap)
    produce_transaction(
        producer, topic, [(i.encode(), v1(payment(n, i), context)) for n, i in enumerate(ids[:40])]
    )
    later = [(i.encode(), v2(payment(n + 100, i, note=f"v2 {n}"), context)) for n, i in enumerate(ids[30:])]
    good = later[0][1]
    bad = [
        (b"bad-magic", b"{}"),
        (b"bad-id", b"\x00" + struct.pack(">I", 2_000_000) + good[5:]),
        (b"bad-cut", good[:8]),
    ]
    produce_transaction(producer, topic, [*later, *bad, (ids[0].encode(), None)])
    produce_transaction(producer, topic, [(ids[1].encode(), v2(payment(-1, ids[1]), context))], commit=False)

    found = applied_both_ways(
        lambda: parse_avro(stream(spark, bootstrap, topic, source), registry.url, key_column="event_id"),
        db,
        pg,
        "event_id text PRIMARY KEY, n bigint NOT NULL, amount numeric(12,2), paid boolean,"
        " rate double precision, note text",
        tmp_path,
        caplog,
    )

    assert found[True] == found[False]
    rows, dead = found[True]
    by_id = {r[0]: r for r in rows}
    assert len(by_id) == 59 and ids[0] not in by_id  # 40 v1, 30 v2 (10 of them edits), one deleted
    assert by_id[ids[1]] == (ids[1], 1, Decimal("1.05"), False, 1 / 7, None)  # its edit was aborted
    assert by_id[ids[35]] == (ids[35], 105, Decimal("105.05"), False, 105 / 7, "v2 5")
    assert by_id[ids[5]] == (ids[5], 5, Decimal("5.05"), False, 5 / 7, None)  # v1: the default
    reasons = dict(dead)
    assert sorted(reasons) == [b"bad-cut", b"bad-id", b"bad-magic"], reasons
    assert "schema id 2000000 is not known to the schema registry" in reasons[b"bad-id"]


def fresh(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema under a new id: the registry gives one id to each content, and a Python worker
    keeps what it was given for an id."""
    return {**schema, "doc": unique("v")}


def produced(
    registry: RunningRegistry, bootstrap: str, topic: str, schema: dict[str, Any], count: int, note: str
) -> list[dict[str, Any]]:
    """`count` orders of `schema`, by Confluent's serializer, in one committed transaction."""
    context = SerializationContext(topic, MessageField.VALUE)
    records = [order(n, str(uuid.uuid4()), note=note) for n in range(count)]
    write = serializer(registry, schema)
    produce_transaction(
        transactional_producer(bootstrap), topic, [(None, write(r, context)) for r in records]
    )
    return records


@contextlib.contextmanager
def stopped(registry: RunningRegistry) -> Iterator[None]:
    """The registry stopped (SIGSTOP): connections are taken, nothing is answered."""
    os.kill(registry.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(registry.pid, signal.SIGCONT)


def test_a_registry_that_does_not_answer_is_waited_for_with_one_line_and_one_when_it_answers(  # type: ignore[no-untyped-def]
    registry, caplog
) -> None:
    schema = fresh(V2)
    value = serializer(registry, schema)(
        order(1, str(uuid.uuid4()), note="x"), SerializationContext("t", MessageField.VALUE)
    )
    schema_id = struct.unpack(">I", value[1:5])[0]
    got: list[Any] = []
    asking = threading.Thread(target=lambda: got.append(Registry.of(registry.url).schema(schema_id)))
    with caplog.at_level(logging.WARNING, logger="outbox.registry"), stopped(registry):
        asking.start()
        wait_for(lambda: "waiting for it" in caplog.text, 30, "the line that it waits")
        assert asking.is_alive()
    asking.join(30)
    assert not asking.is_alive()
    assert json.loads(got[0].schema_str)["doc"] == schema["doc"]
    assert caplog.text.count("waiting for it") == caplog.text.count("answers again after") == 1, caplog.text
    assert registry.url.split("/apis")[0].replace("http://", "") in caplog.text


def test_a_batch_waits_for_a_registry_that_does_not_answer_and_dead_letters_nothing_for_it(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    pg.execute(TABLE)
    schema = fresh(V2)
    records = produced(registry, bootstrap, topic, schema, 20, note="w")

    frame = parse_avro(stream(spark, bootstrap, topic), registry.url, schema=json.dumps(schema))
    sink = PostgresSink("avro_orders", url=db.raw)
    with stopped(registry):
        query = sink.start(frame, str(checkpoint), trigger={"availableNow": True})
        time.sleep(12)  # past a request's 5 s and the 5 s before the wait is said
        assert query.isActive
        assert pg.execute("SELECT count(*) FROM avro_orders").fetchone() == (0,)
    query.awaitTermination(120)
    assert rows(pg) == {r["event_id"]: expected(r, "w") for r in records}
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)


def test_a_spark_connect_client_applies_avro_records_as_a_classic_one(  # type: ignore[no-untyped-def]
    connect_server, bootstrap, topic, db, pg, registry, tmp_path
) -> None:
    """The decoder runs beside the server, pickled from the client, and asks the registry there."""
    pg.execute(TABLE)
    context = SerializationContext(topic, MessageField.VALUE)
    records = [order(n, str(uuid.uuid4()), note="c") for n in range(30)]
    write = serializer(registry, V2)
    produce_transaction(
        transactional_producer(bootstrap),
        topic,
        [(r["event_id"].encode(), write(r, context)) for r in records],
    )
    route = probe(connect_server.url, tmp_path, "avro", bootstrap, topic, registry.url, db.raw, "avro_orders")
    assert rows(pg) == {r["event_id"]: expected(r, "c") for r in records}, route
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)


def test_a_v2_schema_with_a_new_field_adds_its_column_under_evolve(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, outbox_db, pg, registry, checkpoint
) -> None:
    """A table made from v1 by create=True; v2 registered with a field more; the query started again
    on its checkpoint reads with v2, adds the column and writes it, the rows of v1 kept."""
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = serializer(registry, PLAIN_V1), serializer(registry, PLAIN_V2)
    producer = transactional_producer(bootstrap)
    first, later = str(uuid.uuid4()), str(uuid.uuid4())
    body = {"n": 1, "amount": Decimal("1.05"), "paid": True, "rate": 0.5}

    def run() -> None:
        frame = parse_avro(stream(spark, bootstrap, topic), registry.url, key_column="event_id")
        sink = PostgresSink("payments", url=outbox_db.raw, create=True, evolve=True)
        sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination()

    produce_transaction(producer, topic, [(first.encode(), v1({"event_id": first, **body}, context))])
    run()
    produce_transaction(
        producer, topic, [(later.encode(), v2({"event_id": later, **body, "note": "v2"}, context))]
    )
    run()

    found = pg.execute("SELECT event_id, n, note FROM payments ORDER BY n, note NULLS FIRST").fetchall()
    assert sorted(found, key=str) == sorted([(first, 1, None), (later, 1, "v2")], key=str)
    types = pg.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 'payments'::regclass AND attnum > 0 ORDER BY attnum"
    ).fetchall()
    assert types == [
        ("event_id", "text"),
        ("n", "bigint"),
        ("amount", "numeric(12,2)"),
        ("paid", "boolean"),
        ("rate", "double precision"),
        ("note", "text"),
    ]


def registered_id(registry: RunningRegistry, schema: dict[str, Any]) -> int:
    value = serializer(registry, schema)(
        order(1, str(uuid.uuid4()), note="x"), SerializationContext(unique("t"), MessageField.VALUE)
    )
    return int(struct.unpack(">I", value[1:5])[0])


@pytest.mark.parametrize("fault", ["html-404", "500", "503-html", "hang"])
def test_a_registry_fault_of_the_moment_is_waited_for_not_taken_for_an_unknown_id(  # type: ignore[no-untyped-def]
    registry, fault
) -> None:
    """Through a proxy that answers the first two requests with a proxy's 404 page, a server
    error, an ingress's 503 page or nothing at all: the id is asked again and read, not unknown."""
    schema = fresh(V2)
    schema_id = registered_id(registry, schema)
    with FaultyProxy(registry.url) as proxy:
        proxy.fail_next(fault, times=2)
        got = Registry.of(proxy.url).schema(schema_id)
        assert proxy.faulted == 2
    assert json.loads(got.schema_str)["doc"] == schema["doc"]


def test_a_registry_that_refuses_the_client_fails_in_one_coded_line_with_no_secret(registry) -> None:  # type: ignore[no-untyped-def]
    schema_id = registered_id(registry, fresh(V2))
    with FaultyProxy(registry.url) as proxy:
        proxy.fail_next("401")
        refusing = Registry.of({"url": proxy.url, "basic.auth.user.info": "reader:s3cret-pw"})
        with pytest.raises(OutboxError) as refused:
            refusing.schema(schema_id)
    said = str(refused.value)
    assert refused.value.code == "REGISTRY_REFUSED_CLIENT" and len(said.splitlines()) == 1, said
    assert "HTTP 401" in said and "basic.auth.user.info" in said and "s3cret" not in said, said


@pytest.mark.parametrize("fault", ["html-404", "500"])
def test_a_batch_through_a_registry_proxy_that_fails_its_first_requests_applies_every_record(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint, fault
) -> None:
    """The first requests for a new writer schema get a proxy's 404 page or a server error: every
    record of that id is applied and none is a dead letter (a worker once kept the fault as the
    id's answer, and dead-lettered the id's records until it ended)."""
    pg.execute(TABLE)
    schema = fresh(V2)
    records = produced(registry, bootstrap, topic, schema, 30, note="p")
    with FaultyProxy(registry.url) as proxy:
        proxy.fail_next(fault, times=3)
        frame = parse_avro(stream(spark, bootstrap, topic), proxy.url, schema=json.dumps(schema))
        query = PostgresSink("avro_orders", url=db.raw).start(
            frame, str(checkpoint), trigger={"availableNow": True}
        )
        query.awaitTermination(240)
        assert query.exception() is None, query.exception()
        assert proxy.faulted == 3
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)
    assert rows(pg) == {r["event_id"]: expected(r, "p") for r in records}


def test_a_registry_that_refuses_the_sink_stops_the_query_in_its_own_line_and_loses_nothing(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """A registry that answers 401 (credentials gone stale): the query stops with the coded line
    its task raised, not Spark's job failure around a worker's traceback; nothing is applied or
    dead-lettered, and the query started again with a registry that answers applies every record."""
    pg.execute(TABLE)
    schema = fresh(V2)
    records = produced(registry, bootstrap, topic, schema, 10, note="r")

    def run(url: str) -> None:
        frame = parse_avro(stream(spark, bootstrap, topic), url, schema=json.dumps(schema))
        sink = PostgresSink("avro_orders", url=db.raw)
        sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination(240)

    with FaultyProxy(registry.url) as proxy:
        proxy.fail_next("401", times=1000)
        with pytest.raises(StreamingQueryException) as stopped_:
            run(proxy.url)
    said = str(stopped_.value)
    assert "[REGISTRY_REFUSED_CLIENT] the schema registry at http://127.0.0.1:" in said, said
    assert "PythonException" not in said and "decoded.py" not in said, said
    assert pg.execute("SELECT count(*) FROM avro_orders").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)
    run(registry.url)
    assert rows(pg) == {r["event_id"]: expected(r, "r") for r in records}


KEY_RECORD = {
    "type": "record",
    "name": "OrderKey",
    "namespace": "shop",
    "fields": [{"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}}],
}


@pytest.mark.parametrize("key_schema", [{"type": "string"}, KEY_RECORD], ids=["string", "record"])
def test_tombstones_whose_keys_are_avro_delete_the_rows_confluents_deserializer_reads_them_as(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint, key_schema
) -> None:
    """Keys by Confluent's key serializer, Avro in its wire format (a zero byte in every key, which
    read as text was a dead letter): each tombstone deletes the row of the key column its key
    gives, the key itself or its record's field, as AvroDeserializer reads the key; a key of an id
    the registry never gave is a dead letter saying so."""
    pg.execute(TABLE)
    values = serializer(registry, fresh(V2))
    keys = AvroSerializer(registry.client(), json.dumps({**key_schema, "doc": unique("k")}))
    key_context = SerializationContext(topic, MessageField.KEY)
    value_context = SerializationContext(topic, MessageField.VALUE)

    def key_of(event_id: str) -> bytes:
        return bytes(
            keys(event_id if key_schema["type"] == "string" else {"event_id": event_id}, key_context)
        )

    records = [order(n, str(uuid.uuid4()), note="k") for n in range(6)]
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(key_of(r["event_id"]), values(r, value_context)) for r in records])
    tombstones = [key_of(r["event_id"]) for r in records[:3]]
    unknown = b"\x00" + struct.pack(">I", 2_000_000) + tombstones[0][5:]
    produce_transaction(producer, topic, [*((k, None) for k in tombstones), (unknown, None)])

    judge = AvroDeserializer(registry.client())
    read = [judge(k, key_context) for k in tombstones]
    gone = {k if isinstance(k, str) else str(k["event_id"]) for k in read}
    assert gone == {r["event_id"] for r in records[:3]}, read
    frame = parse_avro(
        stream(spark, bootstrap, topic),
        registry.url,
        key_column="event_id",
        key_format="avro",
        subject=f"{topic}-value",
    )
    PostgresSink("avro_orders", url=db.raw).start(
        frame, str(checkpoint), trigger={"availableNow": True}
    ).awaitTermination(240)
    assert rows(pg) == {r["event_id"]: expected(r, "k") for r in records if r["event_id"] not in gone}
    (reason,) = [e for (e,) in pg.execute("SELECT error FROM sink_dead_letters")]
    assert "the Kafka key of this tombstone: schema id 2000000 is not known" in reason, reason


def test_a_writer_the_reader_cannot_resolve_stops_the_query_in_one_line_and_loses_nothing(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """Records of a writer without a field the reader needs (no default): a schema change, not bad
    records. The query stops naming the field and the remedy, nothing dead-lettered (each record
    was one); with the field given a default in the reader, the query applies every record."""
    pg.execute(TABLE)
    writer = fresh(V1)
    records = produced(registry, bootstrap, topic, writer, 8, note="unused")
    needs = {**V2, "fields": [*V1["fields"], {"name": "note", "type": "string"}]}

    def run(reader: dict[str, Any]) -> None:
        frame = parse_avro(stream(spark, bootstrap, topic), registry.url, schema=json.dumps(reader))
        sink = PostgresSink("avro_orders", url=db.raw)
        sink.start(frame, str(checkpoint), trigger={"availableNow": True}).awaitTermination(240)

    with pytest.raises(StreamingQueryException) as stopped_:
        run(needs)
    said = str(stopped_.value)
    assert "[SINK_AVRO_WRITER_UNREADABLE] no record of writer schema id" in said, said
    assert "the reader's note has no default" in said and "PythonException" not in said, said
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM avro_orders").fetchone() == (0,)
    run(V2)  # note's default: "none"
    assert rows(pg) == {r["event_id"]: expected(r, "none") for r in records}


def test_a_union_of_several_types_keeps_each_members_type_in_a_jsonb_column(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """The int 5 and the string "5" of an `["null", "int", "string"]` union reach a jsonb column
    as a number and a string, as confluent-kafka's AvroDeserializer gives them; each was the text 5."""
    schema = {
        "type": "record",
        "name": "Choice",
        "fields": [{"name": "id", "type": "string"}, {"name": "v", "type": ["null", "int", "string"]}],
    }
    pg.execute("CREATE TABLE avro_choices (id text PRIMARY KEY, v jsonb)")
    context = SerializationContext(topic, MessageField.VALUE)
    write, read = serializer(registry, schema), AvroDeserializer(registry.client())
    records = [
        {"id": "int", "v": 5},
        {"id": "text", "v": "5"},
        {"id": "none", "v": None},
        {"id": "q", "v": '"'},
    ]
    values = [write(r, context) for r in records]
    produce_transaction(transactional_producer(bootstrap), topic, [(None, v) for v in values])

    frame = parse_avro(stream(spark, bootstrap, topic), registry.url, schema=schema)
    PostgresSink("avro_choices", url=db.raw, key="id").start(
        frame, str(checkpoint), trigger={"availableNow": True}
    ).awaitTermination()

    got = dict(pg.execute("SELECT id, v FROM avro_choices").fetchall())
    assert got == {r["id"]: read(v, context)["v"] for r, v in zip(records, values, strict=True)}
    assert got == {"int": 5, "text": "5", "none": None, "q": '"'}
