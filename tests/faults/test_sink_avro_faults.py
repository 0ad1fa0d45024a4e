"""kill -9 of an Avro sink job while the topic's schema evolves: every committed event applied once,
in its latest version, checked by our readers (the table, `outbox verify`) and by Kafka's console
consumer (read_committed)."""

from __future__ import annotations

import json
import random
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from outbox.core.config import DatabaseUrl
from outbox_dev.jvm import kafka_tools
from tests.cli import outbox
from tests.conftest import RunningRegistry
from tests.helpers import Job, produce_transaction, transactional_producer
from tests.sink_support import check_exactly_once

pytestmark = pytest.mark.timeout(600)

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "event_id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "n", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    ],
}
V2 = {**V1, "fields": [*V1["fields"], {"name": "version", "type": ["null", "int"], "default": None}]}


def job(
    bootstrap: str, topic: str, registry: RunningRegistry, db: DatabaseUrl, tmp: Path, run: str, *extra: str
) -> Job:
    argv = [bootstrap, topic, registry.url, db.raw, str(tmp / "checkpoint"), str(tmp / run), *extra]
    return Job(["tests/jobs/avro_sink_job.py", *argv], tmp / f"{run}.log", {})


def produce(
    bootstrap: str,
    topic: str,
    registry: RunningRegistry,
    schema: dict[str, Any],
    orders: list[dict[str, Any]],
) -> None:
    """Orders in transactions of 100 (and one aborted), each record's id and fields in headers too,
    for Kafka's console consumer to read without Avro."""
    write = AvroSerializer(registry.client(), json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    producer = transactional_producer(bootstrap)

    def record(o: dict[str, Any]) -> tuple[bytes, bytes]:
        return o["event_id"].encode(), write(o, context)

    for start in range(0, len(orders), 100):
        chunk = orders[start : start + 100]
        producer.begin_transaction()
        for o in chunk:
            key, value = record(o)
            headers = {
                "event_id": o["event_id"],
                "n": str(o["n"]),
                "amount": str(o["amount"]),
                "version": str(o.get("version")),
            }
            producer.produce(topic, key=key, value=value, headers=headers)
        producer.commit_transaction(30)
    produce_transaction(
        producer, topic, [record({**orders[0], "n": -1, "amount": Decimal("0.00")})], commit=False
    )


def test_an_evolving_avro_topic_under_kill_9_is_applied_once_in_its_latest_versions(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg: psycopg.Connection, registry, tmp_path: Path
) -> None:
    ids = [str(uuid.uuid4()) for _ in range(600)]
    first = [{"event_id": i, "n": n, "amount": Decimal("1.00")} for n, i in enumerate(ids[:400])]
    produce(bootstrap, topic, registry, V1, first)

    victim = job(bootstrap, topic, registry, db, tmp_path, "v1")  # its reader: v1, the newest then
    victim.wait_for_output("applied", timeout=180)
    time.sleep(random.uniform(0.0, 2.0))
    victim.kill9()

    # v2 mid-stream: new events, and edits of 40 of v1's with a version.
    edits = [{"event_id": i, "n": n, "amount": Decimal("9.99"), "version": 2} for n, i in enumerate(ids[:40])]
    new = [
        {"event_id": i, "n": n + 400, "amount": Decimal("1.00"), "version": 2}
        for n, i in enumerate(ids[400:])
    ]
    produce(bootstrap, topic, registry, V2, new + edits)
    victim = job(bootstrap, topic, registry, db, tmp_path, "v2")  # a reader of v2 now
    victim.wait_for_output("applied", timeout=180)
    time.sleep(random.uniform(0.0, 3.0))
    victim.kill9()
    last = job(bootstrap, topic, registry, db, tmp_path, "last", "available-now")
    assert last.wait(300) == 0, last.output()[-4000:]

    expected = {o["event_id"]: (o["n"], o["amount"], None) for o in first}
    expected.update({o["event_id"]: (o["n"], o["amount"], 2) for o in new + edits})
    check_exactly_once(pg, bootstrap, topic, expected)

    # Kafka's own reader: the latest committed record of each event, from its headers.
    wanted: dict[str, tuple] = {}
    read = kafka_tools.console_consume(bootstrap, topic, expected=True, values=False)
    for r in sorted(read, key=lambda r: (r.partition, r.offset)):
        version = None if r.headers["version"] == "None" else int(r.headers["version"])
        wanted[r.headers["event_id"]] = (int(r.headers["n"]), Decimal(r.headers["amount"]), version)
    assert wanted == expected

    # outbox verify, reading the Avro values with their writer schemas: every event of the topic is
    # in the table and every row's event in the topic (none missing, none leaked), nothing aborted
    # read; the 40 edits are the only events seen twice.
    said = outbox(
        *("verify", topic, "--bootstrap-servers", bootstrap, "--registry", registry.url, "--id-field"),
        *("event_id", "--url", db.raw, "--source-sql", "SELECT event_id::text FROM orders", "--json"),
    )
    verdict = json.loads(said.out.strip().splitlines()[-1])
    assert verdict["records"] == 640 and verdict["findings"] == {"duplicate": 40}, said
