"""The publishers the relay is measured beside (the raw transactional producer, its limit, and
Debezium on our outbox table), and the names the bench's lines and JSON give every publisher."""

from __future__ import annotations

import argparse
import contextlib
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from debezium import OnOutbox  # bench/debezium.py

from outbox.core.config import DatabaseUrl
from outbox.core.kafka import client_settings
from outbox.relay.kafka import PRODUCER_DEFAULTS
from outbox_dev.debezium import Debezium

# Each Debezium's copy of the outbox table: its slot reads only what is written there.
PEERS = {"debezium": "dbz", "debezium_eos": "dbz_eos"}  # at least once (standalone), exactly once
FLUSHED = {"debezium_flush_1s": "dbz_flush"}  # the standalone worker again, its offsets flushed each second
FLUSH_MS = 1000
LABELS = {
    "debezium": "Debezium",
    "debezium_eos": "Debezium exactly-once",
    "debezium_flush_1s": "Debezium, offsets flushed every 1 s",
    "relay_at_least_once": "relay at least once",
}
# The throughput runs of a round, before any rotation: the JSON's names for their rates.
RUNS = {"raw": "raw_producer", "eos": "relay_exactly_once", "alo": "relay_at_least_once"}
RUN_LABELS = {
    "raw": "raw transactional producer",
    "eos": "relay, exactly-once",
    "alo": "relay, at-least-once",
    "raw_rf3": "RF 3: raw",
    "eos_rf3": "RF 3: relay",
}


def raw_producer(url: DatabaseUrl, bootstrap: str, batch: int, topic: str) -> None:
    """The limit: rows in memory as they are sent (the relay's headers built at load, in start-up),
    one Kafka transaction per batch."""
    with psycopg.connect(url.libpq) as conn:
        rows = [
            (
                value,
                key,
                [("event_id", str(event_id).encode()), *zip(hkeys or (), hvalues or (), strict=True)],
            )
            for event_id, key, value, hkeys, hvalues in conn.execute(
                "SELECT event_id, key, value, header_keys, header_values FROM outbox_events ORDER BY id"
            )
        ]
    producer = Producer(
        client_settings(
            {
                **PRODUCER_DEFAULTS,
                "bootstrap.servers": bootstrap,
                "transactional.id": f"bench-raw-{uuid.uuid4()}",
            },
            "producer",
        )
    )
    producer.init_transactions(30)
    for start in range(0, len(rows), batch):
        producer.begin_transaction()
        for value, key, headers in rows[start : start + batch]:
            producer.produce(topic, value, key, headers=headers)
        producer.commit_transaction(60)
    producer.flush(30)


def read_alone(url: DatabaseUrl, batch: int) -> int:
    """What a publisher from the outbox table does beyond the raw producer: bring its rows into
    Python, `batch` at a time along the primary key; a bare SELECT of the columns a record needs (no
    snapshot, no position, no budget), in binary. Returns the rows read."""
    read, after = 0, 0
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        while rows := (
            conn.cursor(binary=True)
            .execute(
                "SELECT id, event_id, topic, key, value, header_keys, header_values FROM outbox_events"
                " WHERE id > %s ORDER BY id LIMIT %s",
                [after, batch],
            )
            .fetchall()
        ):
            read, after = read + len(rows), rows[-1][0]
    return read


def debezium_peers(
    args: argparse.Namespace, tmp: str, url: DatabaseUrl, bootstrap: str
) -> dict[str, OnOutbox]:
    """Each Debezium peer, its worker under `tmp` (none with --no-debezium): made, not started."""
    peers = {
        name: OnOutbox(Path(tmp) / name, url, bootstrap, schema, exactly_once=name == "debezium_eos")
        for name, schema in ({} if args.no_debezium else PEERS).items()
    }
    # In the mid-stream fault only: a standalone worker that flushes its offsets every second.
    peers |= {
        name: OnOutbox(Path(tmp) / name, url, bootstrap, schema, flush_ms=FLUSH_MS)
        for name, schema in ({} if args.no_debezium else FLUSHED).items()
    }
    return peers


@contextlib.contextmanager
def debezium_running(dbz: Debezium) -> Iterator[dict[str, float]]:
    dbz.start()
    try:
        yield {}
    finally:
        dbz.kill(signal.SIGTERM)
