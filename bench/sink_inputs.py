"""The events the sink bench writes, and the same events as Kafka records, as the Parquet files and
offset ranges its feeds read, and as Avro under a schema registry."""

from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sink_plan import AVRO_SCHEMA  # bench/sink_plan.py


def events(count: int, size: int) -> pa.Table:
    note = "x" * max(0, size - 100)  # the JSON around it is ~100 bytes
    return pa.table(
        {
            "event_id": [str(uuid.UUID(int=i + 1)) for i in range(count)],
            "n": pa.array(range(count), pa.int64()),
            "amount": [f"{i % 100000 / 100:.2f}" for i in range(count)],
            "note": pa.repeat(pa.scalar(note), count),
        }
    )


def records(rows: pa.Table) -> Iterator[tuple[bytes, bytes]]:
    """The events as Kafka records: each keyed by its event id, its row as JSON."""
    return ((r["event_id"].encode(), json.dumps(r).encode()) for r in rows.to_pylist())


def write_parquet(rows: pa.Table, topic: str, partitions: int, per_batch: int, folder: Path) -> None:
    """The rows with the Kafka positions `produce` gave them, as Parquet files a micro-batch reads.

    Each micro-batch is one file per Kafka partition, so Spark splits it into as
    many tasks as it does the same rows from Kafka.
    """
    i = np.arange(rows.num_rows)
    rows = (
        rows.set_column(2, "amount", pc.cast(rows["amount"], pa.decimal128(12, 2)))
        .append_column("topic", pa.repeat(pa.scalar(topic), rows.num_rows))
        .append_column("partition", pa.array(i % partitions, pa.int32()))
        .append_column("offset", pa.array(i // partitions, pa.int64()))
    )
    folder.mkdir()
    for k, start in enumerate(range(0, rows.num_rows, per_batch)):
        batch = rows.slice(start, per_batch)
        for p in range(partitions):
            part = batch.filter(pc.equal(batch["partition"], p))
            pq.write_table(part, folder / f"batch-{k:05d}-partition-{p:05d}.parquet")


def write_ranges(bootstrap: str, topic: str, batches: int, folder: Path) -> list[int]:
    """Each partition of `topic` cut into `batches` offset ranges, one JSON file a micro-batch reads;
    the events each batch holds. The topic was written without transactions: its offsets run on."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ranges"})
    try:
        count = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(count)]
    finally:
        consumer.close()
    folder.mkdir()
    sizes = []
    for k in range(batches):
        cut = [(p, end * k // batches, end * (k + 1) // batches) for p, end in enumerate(ends)]
        lines = [json.dumps({"topic": topic, "partition": p, "start": a, "end": b}) for p, a, b in cut]
        path = folder / f"batch-{k:05d}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (k + 1, k + 1))  # the file source reads in modification order
        sizes.append(sum(b - a for _, a, b in cut))
    return sizes


@contextlib.contextmanager
def schema_registry(folder: Path) -> Iterator[str]:
    """SCHEMA_REGISTRY_URL's registry, else the dev stack's (Apicurio), for the run: its URL."""
    given = os.environ.get("SCHEMA_REGISTRY_URL")
    if given:
        yield given
        return
    from outbox_dev import registry
    from outbox_dev.process import free_port, stop

    service = registry.start(folder, free_port(), die_with_parent=True)
    try:
        yield service.env[registry.SCHEMA_REGISTRY_URL]
    finally:
        stop(service.pid)


def avro_values(rows: pa.Table, topic: str, registry: str) -> list[bytes]:
    """The rows as Confluent's Avro serializer frames them, under the topic's value subject."""
    from confluent_kafka.schema_registry import Schema
    from fastavro import parse_schema, schemaless_writer

    from outbox.core.registry import Registry
    from outbox.core.wire import frame

    schema = Schema(json.dumps(AVRO_SCHEMA), "AVRO")
    schema_id = Registry.of(registry).ask(lambda c: c.register_schema(f"{topic}-value", schema))
    parsed = parse_schema(AVRO_SCHEMA)
    values = []
    for row in rows.to_pylist():
        body = io.BytesIO()
        schemaless_writer(body, parsed, {**row, "amount": Decimal(row["amount"])})
        values.append(frame(schema_id, body.getvalue()))
    return values
