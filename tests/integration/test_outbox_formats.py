"""Avro values written by add_event(s), published by the relay, read by Confluent's own
AvroDeserializer; a schema the registry refuses fails the write with one line."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from outbox import Avro
from outbox.core.config import DatabaseUrl
from outbox.core.errors import OutboxError
from outbox.writer import Event, add_event, add_events
from tests.conftest import RunningRegistry
from tests.helpers import committed_messages, unique
from tests.relay_support import ACTIVE, relay_job, terminate, wait_published

pytestmark = pytest.mark.timeout(240)

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "secret", "type": "string", "default": ""},
    ],
}
# v2: a field added with a default: BACKWARD compatible.
ORDER_V2 = {**ORDER, "fields": [*ORDER["fields"], {"name": "note", "type": "string", "default": "-"}]}


def test_our_avro_events_are_read_back_by_confluents_deserializer_in_commit_order(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str, registry
) -> None:
    ids = []
    with psycopg.connect(outbox_db.libpq) as conn:
        with conn.transaction():
            for n in range(10):
                record = {"id": n, "amount": Decimal(f"{n}.50")}
                ids.append(add_event(conn, events_topic, Avro(record, ORDER), key="k", registry=registry.url))
        with conn.transaction():
            v2 = [
                Event(
                    events_topic, Avro({"id": 10 + n, "amount": Decimal("1.00"), "note": "v2"}, ORDER_V2), "k"
                )
                for n in range(5)
            ]
            ids += add_events(conn, v2, registry={"url": registry.url})

    job, _ = relay_job(tmp_path, env, unique("relay"))
    try:
        job.wait_for_output(ACTIVE, 60)
        assert len(wait_published(bootstrap, events_topic, 3, 15)) == 15
    finally:
        assert terminate(job) == 0, job.output()

    read = AvroDeserializer(registry.client(), json.dumps(ORDER_V2))
    messages = committed_messages(bootstrap, events_topic, 3)
    got = [read(m.value(), SerializationContext(events_topic, MessageField.VALUE)) for m in messages]
    assert [g["id"] for g in got] == list(range(15))
    assert [g["note"] for g in got] == ["-"] * 10 + ["v2"] * 5
    assert got[3]["amount"] == Decimal("3.50")
    assert [dict(m.headers())["event_id"].decode() for m in messages] == [str(i) for i in ids]


def test_a_schema_the_registry_refuses_fails_the_write_with_its_subject_and_rule_and_writes_nothing(
    outbox_db: DatabaseUrl, registry: RunningRegistry
) -> None:
    topic = unique("refused")
    client = registry.client()
    with psycopg.connect(outbox_db.libpq) as conn, conn.transaction():
        add_event(conn, topic, Avro({"id": 1, "amount": Decimal("1.00")}, ORDER), registry=registry.url)
    client.set_compatibility(f"{topic}-value", "BACKWARD")
    # A new field without a default: v1's records could not be read with it.
    breaking = copy.deepcopy(ORDER)
    breaking["fields"].append({"name": "required", "type": "string"})
    with psycopg.connect(outbox_db.libpq) as conn, conn.transaction():
        with pytest.raises(OutboxError) as refused:
            value = Avro({"id": 2, "amount": Decimal("1.00"), "required": "x"}, breaking)
            add_event(conn, topic, value, registry=registry.url)
        assert refused.value.code == "OUTBOX_SCHEMA_REFUSED"
        said = str(refused.value)
        assert f"subject '{topic}-value'" in said and "HTTP 409, compatibility BACKWARD" in said, said
        # The transaction goes on: nothing of the refused write, and the caller's next statement works.
        assert conn.execute("SELECT count(*) FROM outbox_events WHERE topic = %s", [topic]).fetchone() == (1,)


def test_a_record_that_does_not_match_its_schema_is_named_by_field_never_by_value(
    outbox_db: DatabaseUrl, registry: RunningRegistry
) -> None:
    with psycopg.connect(outbox_db.libpq) as conn, conn.transaction(), pytest.raises(OutboxError) as refused:
        add_event(
            conn,
            "t",
            Avro({"id": "not a long", "amount": Decimal("1.00"), "secret": 7}, ORDER),
            registry=registry.url,
        )
    said = str(refused.value)
    assert refused.value.code == "OUTBOX_VALUE_NOT_ENCODABLE"
    assert "field(s) id, secret do not match" in said and "not a long" not in said, said


def test_without_a_registry_an_avro_value_is_refused_with_where_to_name_one(
    outbox_db: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCHEMA_REGISTRY_URL", raising=False)
    with (
        psycopg.connect(outbox_db.libpq) as conn,
        conn.transaction(),
        pytest.raises(OutboxError, match="SCHEMA_REGISTRY_URL") as refused,
    ):
        add_event(conn, "t", Avro({"id": 1, "amount": Decimal("1.00")}, ORDER))
    assert refused.value.code == "OUTBOX_REGISTRY_MISSING"
