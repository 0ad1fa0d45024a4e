"""Debezium as the relay's peer in bench/relay.py: its outbox EventRouter over our own outbox
table, on Kafka Connect (outbox_dev.debezium runs the worker).

The connector reads `outbox_events` through a logical replication slot with
pgoutput, and the EventRouter routes each row by its `topic` column, keys it
by `key`, and puts `event_id` in a header, as the relay does.
"""

from __future__ import annotations

from pathlib import Path

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox_dev.debezium import Debezium


def connector(table: str) -> dict[str, str]:
    return {
        # Our table's columns Debezium has no use for (xid8 and bytea[] it cannot map).
        "column.exclude.list": ",".join(f"{table}.{c}" for c in ("txid", "header_keys", "header_values")),
        "binary.handling.mode": "bytes",
        # Tuned as Debezium's performance advice goes: bigger batches and queue, a short
        # poll interval, a producer that batches (defaults: 2048, 8192, 500 ms, linger 0).
        "max.batch.size": "10240",
        "max.queue.size": "40960",
        "poll.interval.ms": "50",
        "producer.override.linger.ms": "5",
        "producer.override.batch.size": "524288",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "event_id",
        "transforms.outbox.table.field.event.key": "key",
        "transforms.outbox.table.field.event.payload": "value",
        "transforms.outbox.route.by.field": "topic",
        "transforms.outbox.route.topic.replacement": "${routedByValue}",
        "transforms.outbox.table.fields.additional.placement": "event_id:header:event_id",
    }


class OnOutbox(Debezium):
    """Debezium publishing our outbox table in `schema`, as the relay does; the schema kept, for the
    bench's writes there."""

    def __init__(
        self,
        work: Path,
        url: DatabaseUrl,
        bootstrap: str,
        schema: str,
        *,
        exactly_once: bool = False,
        flush_ms: int | None = None,
    ) -> None:
        table = f"{schema}.{tables.OUTBOX_EVENTS}"
        super().__init__(
            work, url, bootstrap, [table], connector(table), exactly_once=exactly_once, flush_ms=flush_ms
        )
        self.schema = schema
