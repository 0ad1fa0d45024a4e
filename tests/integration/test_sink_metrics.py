"""The sink's Prometheus metrics, scraped over HTTP while its streaming query runs (real Spark, Kafka,
PostgreSQL), fed from the query's progress."""

from __future__ import annotations

import re
import urllib.request
import uuid

from sinks.postgres import PostgresSink, parse_json
from tests.helpers import produce_transaction, transactional_producer, wait_for
from tests.sink_support import SCHEMA, event
from tests.source_support import stream


def _scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def test_the_sinks_metrics_are_scraped_while_its_query_runs(spark, bootstrap, topic, db, checkpoint) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(20)]
    producer = transactional_producer(bootstrap)
    batch = [event(i, n) for n, i in enumerate(ids)]
    produce_transaction(producer, topic, batch + batch[:5], partition=0)  # 5 redelivered in the batch

    sink = PostgresSink("orders", url=db.raw)
    metrics = sink.serve_metrics(spark)
    frame = parse_json(stream(spark, bootstrap, topic), SCHEMA, key_column="event_id")
    query = sink.start(frame, str(checkpoint), trigger={"processingTime": "1 second"})
    held = transactional_producer(bootstrap, f"held-{uuid.uuid4().hex[:8]}")
    try:
        who = f'sink="{sink.name}"'
        wait_for(
            lambda: _scrape(metrics.address).get(f"outbox_sink_events_applied_total{{{who}}}") == 20,
            90,
            "20 applied",
        )
        seen = _scrape(metrics.address)
        assert seen[f"outbox_sink_events_skipped_total{{{who}}}"] == 5
        assert seen[f"outbox_sink_dead_letters_total{{{who}}}"] == 0
        assert seen[f"outbox_sink_batch_seconds_count{{{who}}}"] >= 1
        assert seen[f'outbox_sink_lag{{partition="0",{who},topic="{topic}"}}'] == 0

        # A transaction left open on partition 1: its record shows as held past the LSO in the
        # progress of the next batch (an idle query reports none; the gauges keep their values).
        held.begin_transaction()
        held.produce(topic, key=b"k", value=b"{}", partition=1)
        held.flush(30)
        produce_transaction(producer, topic, [event(str(uuid.uuid4()), 99)], partition=0)
        gauge = f'outbox_sink_uncommitted{{partition="1",{who},topic="{topic}"}}'
        wait_for(lambda: _scrape(metrics.address).get(gauge) == 1, 90, "the open transaction's record")
    finally:
        held.abort_transaction(30)
        query.stop()
        spark.streams.removeListener(metrics)
        metrics.close()
