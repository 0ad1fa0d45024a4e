"""Protobuf both ways against a real schema registry (Apicurio, Confluent's API): Confluent's own
ProtobufSerializer's records applied by parse_protobuf as the message evolves, values that cannot
be read, and our writer's records read back by Confluent's ProtobufDeserializer."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

from outbox import Protobuf
from outbox.core.config import DatabaseUrl
from outbox.core.wire import frame
from outbox.writer import add_event
from sinks.postgres import PostgresSink, parse_protobuf
from tests.conftest import RunningRegistry
from tests.helpers import committed_messages, produce_transaction, transactional_producer, unique
from tests.relay_support import ACTIVE, relay_job, terminate, wait_published
from tests.sink_support import applied_both_ways, ledger, log_ends
from tests.source_support import stream

pytestmark = pytest.mark.timeout(300)

TABLE = (
    "CREATE TABLE pb_orders (event_id uuid PRIMARY KEY, n bigint NOT NULL, placed timestamptz,"
    " status text, tags text[], big numeric, note text)"
)
F = descriptor_pb2.FieldDescriptorProto


def order_class(
    version: int, package: str = "shop", only: tuple[str, ...] = (), wrapped: bool = False
) -> Any:
    """shop.Order, v1 or v2 (v2 adds `note`; `wrapped`, a google.protobuf.StringValue), made from its
    descriptor as protoc's output would be; of its fields `only` those, if given."""
    imports = ["google/protobuf/timestamp.proto", *(["google/protobuf/wrappers.proto"] if wrapped else [])]
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{package}/order_v{version}.proto", package=package, syntax="proto3", dependency=imports
    )
    status = file.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    message = file.message_type.add(name="Order")
    fields = [
        ("event_id", 1, F.TYPE_STRING, None, F.LABEL_OPTIONAL),
        ("n", 2, F.TYPE_INT64, None, F.LABEL_OPTIONAL),
        ("placed", 3, F.TYPE_MESSAGE, ".google.protobuf.Timestamp", F.LABEL_OPTIONAL),
        ("status", 4, F.TYPE_ENUM, f".{package}.Status", F.LABEL_OPTIONAL),
        ("tags", 5, F.TYPE_STRING, None, F.LABEL_REPEATED),
        ("big", 6, F.TYPE_UINT64, None, F.LABEL_OPTIONAL),
    ]
    if version == 2 and wrapped:
        fields.append(("note", 7, F.TYPE_MESSAGE, ".google.protobuf.StringValue", F.LABEL_OPTIONAL))
    elif version == 2:
        fields.append(("note", 7, F.TYPE_STRING, None, F.LABEL_OPTIONAL))
    for name, number, kind, type_name, label in fields:
        if only and name not in only:
            continue
        field = message.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    if wrapped:
        pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


def order(kind: Any, n: int, event_id: str, **more: Any) -> Any:
    placed = dt.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=dt.UTC) + dt.timedelta(hours=n)
    return kind(
        event_id=event_id, n=n, placed=placed, status=n % 2, tags=[f"t{n}"], big=2**64 - 1 - abs(n), **more
    )


def expected(message: Any, note: str | None) -> tuple:
    placed = message.placed.ToDatetime(tzinfo=dt.UTC)
    return (message.n, placed, "PAID" if message.n % 2 else "NEW", list(message.tags), message.big, note)


def rows(pg: psycopg.Connection) -> dict[str, tuple]:
    found = pg.execute("SELECT event_id::text, n, placed, status, tags, big, note FROM pb_orders").fetchall()
    return {r[0]: r[1:] for r in found}


def serializer(registry: RunningRegistry, kind: Any) -> ProtobufSerializer:
    return ProtobufSerializer(kind, registry.client(), {"use.deprecated.format": False})


def test_confluents_protobuf_records_of_an_evolving_message_are_applied_once(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """v1 records, then v2's (a field added), by Confluent's ProtobufSerializer; a tombstone; an
    aborted transaction. The reader is the subject's newest message, which parses each value: v1's
    records have proto3's default note, as Confluent's ProtobufDeserializer gives them."""
    pg.execute(TABLE)
    v1, v2 = order_class(1), order_class(2)
    context = SerializationContext(topic, MessageField.VALUE)
    ids = [str(uuid.uuid4()) for _ in range(30)]
    first = [order(v1, n, i) for n, i in enumerate(ids[:20])]
    later = [order(v2, n + 100, i, note=f"v2 {n}") for n, i in enumerate(ids[15:])]
    write1, write2 = serializer(registry, v1), serializer(registry, v2)  # one each, as an application has
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(m.event_id.encode(), write1(m, context)) for m in first])
    produce_transaction(producer, topic, [(m.event_id.encode(), write2(m, context)) for m in later])
    produce_transaction(producer, topic, [(ids[0].encode(), None)])
    aborted = write2(order(v2, -1, ids[1], note="no"), context)
    produce_transaction(producer, topic, [(ids[1].encode(), aborted)], commit=False)

    frame_ = parse_protobuf(stream(spark, bootstrap, topic), registry.url, key_column="event_id")
    sink = PostgresSink("pb_orders", url=db.raw)
    sink.start(frame_, str(checkpoint), trigger={"availableNow": True}).awaitTermination()

    want = {m.event_id: expected(m, "") for m in first[1:]}  # proto3's default, as Protobuf reads it
    want.update({m.event_id: expected(m, m.note) for m in later})
    assert rows(pg) == want
    assert ledger(pg) == log_ends(bootstrap, topic)
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)


def test_a_v2_that_adds_a_wrapper_field_mid_stream_is_read_by_a_reader_of_that_wrapper(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """v2 adds `google.protobuf.StringValue note`, a well-known type Confluent's serializer does not
    register as a reference: v2's records are read with it (their note its value), v1's have none
    (NULL: a message field not set, as Confluent's ProtobufDeserializer gives it), and the reader,
    the newest message, is the wrapper's too. Nothing is a dead letter."""
    pg.execute(TABLE)
    package = unique("w")
    v1, v2 = order_class(1, package), order_class(2, package, wrapped=True)
    context = SerializationContext(topic, MessageField.VALUE)
    first = [order(v1, n, str(uuid.uuid4())) for n in range(10)]
    later = [order(v2, n + 100, str(uuid.uuid4())) for n in range(10)]
    for n, message in enumerate(later):
        if n % 3:  # and every third one with no note at all
            message.note.value = f"wrapped {n}" if n % 3 == 1 else ""
    write1, write2 = serializer(registry, v1), serializer(registry, v2)
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(m.event_id.encode(), write1(m, context)) for m in first])
    produce_transaction(producer, topic, [(m.event_id.encode(), write2(m, context)) for m in later])

    frame_ = parse_protobuf(stream(spark, bootstrap, topic), registry.url, key_column="event_id")
    sink = PostgresSink("pb_orders", url=db.raw)
    sink.start(frame_, str(checkpoint), trigger={"availableNow": True}).awaitTermination()

    judge = ProtobufDeserializer(v2, {"use.deprecated.format": False})
    want = {m.event_id: expected(m, None) for m in first}
    for message in later:
        read = judge(write2(message, context), context)
        want[message.event_id] = expected(message, read.note.value if read.HasField("note") else None)
    assert rows(pg) == want
    assert {v[-1] for v in want.values()} == {None, "", "wrapped 1", "wrapped 4", "wrapped 7"}
    assert pg.execute("SELECT count(*) FROM sink_dead_letters").fetchone() == (0,)


def test_the_tasks_read_protobuf_from_kafka_themselves_and_apply_what_sparks_rows_apply(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, tmp_path, caplog
) -> None:
    """A message of fields the tasks read as written: the tasks decode it themselves, and give the
    rows and the dead letters Spark's rows give."""
    kind = order_class(2, package=unique("p"), only=("event_id", "n", "status", "big", "note"))
    write, context = serializer(registry, kind), SerializationContext(topic, MessageField.VALUE)
    ids = [str(uuid.uuid4()) for _ in range(30)]
    messages = [
        kind(event_id=i, n=n, status=n % 2, big=2**64 - 1 - n, note=f"n{n}") for n, i in enumerate(ids)
    ]
    records = [(m.event_id.encode(), write(m, context)) for m in messages]
    produce_transaction(
        transactional_producer(bootstrap), topic, [*records, (b"bad", b"{}"), (ids[0].encode(), None)]
    )

    found = applied_both_ways(
        lambda: parse_protobuf(stream(spark, bootstrap, topic), registry.url, key_column="event_id"),
        db,
        pg,
        "event_id text PRIMARY KEY, n bigint NOT NULL, status text, big numeric, note text",
        tmp_path,
        caplog,
    )

    assert found[True] == found[False]
    rows, dead = found[True]
    assert rows == sorted(
        (m.event_id, m.n, "PAID" if m.n % 2 else "NEW", m.big, m.note) for m in messages[1:]
    )
    assert [key for key, _ in dead] == [b"bad"]


def test_protobuf_values_that_cannot_be_read_are_dead_letters_naming_why(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    pg.execute(TABLE)
    kind = order_class(2, package=unique("p"))
    good = serializer(registry, kind)(
        order(kind, 3, str(uuid.uuid4()), note="ok"), SerializationContext(topic, MessageField.VALUE)
    )
    schema_id = int.from_bytes(good[1:5], "big")
    avro_id = registry.client().register_schema(unique("avro"), Schema('"long"', "AVRO"))
    records = [
        (b"a", b"{}"),  # no magic byte
        (b"b", frame(2_000_000, good[5:])),  # an unknown id
        (b"c", frame(schema_id, b"\x00\x0a\xff\xff")),  # a body that is no message
        (b"d", frame(schema_id, b"\x02\x0e" + good[6:])),  # a message index past the file's
        (b"e", frame(avro_id, good[5:])),  # an id that names an Avro schema
        (b"f", good),
    ]
    produce_transaction(transactional_producer(bootstrap), topic, records)

    frame_ = parse_protobuf(stream(spark, bootstrap, topic), registry.url)
    PostgresSink("pb_orders", url=db.raw).start(
        frame_, str(checkpoint), trigger={"availableNow": True}
    ).awaitTermination()

    assert len(rows(pg)) == 1
    dead = dict(pg.execute("SELECT key, error FROM sink_dead_letters").fetchall())
    assert sorted(dead) == [b"a", b"b", b"c", b"d", b"e"]
    assert "magic byte 0" in dead[b"a"]
    assert "schema id 2000000 is not known" in dead[b"b"]
    assert f"does not decode as Protobuf of writer schema id {schema_id}" in dead[b"c"], dead[b"c"]
    assert f"does not decode as Protobuf of writer schema id {schema_id}: IndexError" in dead[b"d"], dead[
        b"d"
    ]
    assert f"schema id {avro_id} is a AVRO schema, not Protobuf" in dead[b"e"], dead[b"e"]


def test_our_protobuf_events_are_read_back_by_confluents_deserializer(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str, registry
) -> None:
    kind = order_class(2, package=unique("w"))
    sent = [order(kind, n, str(uuid.uuid4()), note=f"n{n}") for n in range(8)]
    with psycopg.connect(outbox_db.libpq) as conn, conn.transaction():
        for message in sent:
            add_event(conn, events_topic, Protobuf(message), key="k", registry=registry.url)

    job, _ = relay_job(tmp_path, env, unique("relay"))
    try:
        job.wait_for_output(ACTIVE, 60)
        assert len(wait_published(bootstrap, events_topic, 3, len(sent))) == len(sent)
    finally:
        assert terminate(job) == 0, job.output()

    read = ProtobufDeserializer(kind, {"use.deprecated.format": False})
    context = SerializationContext(events_topic, MessageField.VALUE)
    got = [read(m.value(), context) for m in committed_messages(bootstrap, events_topic, 3)]
    assert got == sent


PROTO_TEXT = """syntax = "proto3";
package %s;
import "google/protobuf/timestamp.proto";
enum Status { NEW = 0; PAID = 1; }
message Order {
  string event_id = 1;
  int64 n = 2;
  google.protobuf.Timestamp placed = 3;
  Status status = 4;
  repeated string tags = 5;
  uint64 big = 6;
  string note = 7;
}
"""


def test_a_schema_registered_as_proto_text_as_javas_serializer_does_is_read(  # type: ignore[no-untyped-def]
    spark, bootstrap, topic, db, pg, registry, checkpoint
) -> None:
    """Java's KafkaProtobufSerializer registers .proto text: the registry gives it serialized."""
    pg.execute(TABLE)
    package = unique("j")
    schema_id = registry.client().register_schema(f"{topic}-value", Schema(PROTO_TEXT % package, "PROTOBUF"))
    kind = order_class(2, package=package)
    sent = [order(kind, n, str(uuid.uuid4()), note="java") for n in range(5)]
    framed = [(None, frame(schema_id, b"\x00" + m.SerializeToString())) for m in sent]
    produce_transaction(transactional_producer(bootstrap), topic, framed)

    frame_ = parse_protobuf(stream(spark, bootstrap, topic), registry.url)
    PostgresSink("pb_orders", url=db.raw).start(
        frame_, str(checkpoint), trigger={"availableNow": True}
    ).awaitTermination()

    assert rows(pg) == {m.event_id: expected(m, "java") for m in sent}
