"""The sink's Prometheus metrics, scraped over HTTP while its streaming query runs (real Spark, Kafka,
PostgreSQL), fed from the query's progress."""

from __future__ import annotations

import re
import urllib.request
import uuid
from pathlib import Path

from outbox_dev.connect import ConnectServer
from sinks.postgres import PostgresSink, parse_json
from tests.helpers import Job, produce_transaction, transactional_producer, wait_for
from tests.sink_support import SCHEMA, event
from tests.source_support import stream

SINK_JOB = "tests/jobs/sink_job.py"


def _scrape(address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def _produce(bootstrap: str, topic: str) -> None:
    """20 events at version 2 on partition 0, 5 of them redelivered and 3 sent again at version 1,
    in the same transaction."""
    ids = [str(uuid.uuid4()) for _ in range(20)]
    batch = [event(i, n, version=2) for n, i in enumerate(ids)]
    older = [event(i, -1, version=1) for i in ids[:3]]
    produce_transaction(transactional_producer(bootstrap), topic, batch + batch[:5] + older, partition=0)


def _observe(address: str, sink: str, bootstrap: str, topic: str) -> None:
    """The counters once the 20 are applied; then a transaction left open on partition 1 shows as
    held past the LSO in the progress of the next batch (an idle query reports none; the gauges
    keep their values)."""
    who = f'sink="{sink}"'
    wait_for(
        lambda: _scrape(address).get(f"outbox_sink_events_applied_total{{{who}}}") == 20, 90, "20 applied"
    )
    seen = _scrape(address)
    assert seen[f"outbox_sink_events_skipped_total{{{who}}}"] == 8
    assert seen[f"outbox_sink_events_duplicates_total{{{who}}}"] == 5
    assert seen[f"outbox_sink_events_stale_total{{{who}}}"] == 3
    assert seen[f"outbox_sink_events_replayed_total{{{who}}}"] == 0
    assert seen[f"outbox_sink_dead_letters_total{{{who}}}"] == 0
    assert seen[f"outbox_sink_batch_seconds_count{{{who}}}"] >= 1
    assert seen[f'outbox_sink_lag{{partition="0",{who},topic="{topic}"}}'] == 0
    held = transactional_producer(bootstrap, f"held-{uuid.uuid4().hex[:8]}")
    held.begin_transaction()
    try:
        held.produce(topic, key=b"k", value=b"{}", partition=1)
        held.flush(30)
        produce_transaction(
            transactional_producer(bootstrap), topic, [event(str(uuid.uuid4()), 99)], partition=0
        )
        gauge = f'outbox_sink_uncommitted{{partition="1",{who},topic="{topic}"}}'
        wait_for(lambda: _scrape(address).get(gauge) == 1, 90, "the open transaction's record")
    finally:
        held.abort_transaction(30)


def test_the_sinks_metrics_are_scraped_while_its_query_runs(spark, bootstrap, topic, db, checkpoint) -> None:  # type: ignore[no-untyped-def]
    _produce(bootstrap, topic)
    sink = PostgresSink("orders", url=db.raw, version="version")
    metrics = sink.serve_metrics(spark)
    frame = parse_json(stream(spark, bootstrap, topic), SCHEMA, key_column="event_id")
    query = sink.start(frame, str(checkpoint), trigger={"processingTime": "1 second"})
    try:
        _observe(metrics.address, sink.name, bootstrap, topic)
    finally:
        query.stop()
        metrics.close()


def test_a_spark_connect_client_serves_the_same_metrics(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, topic, db, tmp_path: Path
) -> None:
    """The listener in the client, fed by the progress the server sends it; what the sink did read
    from PostgreSQL, as its batches run beside the server."""
    _produce(bootstrap, topic)
    argv = [SINK_JOB, bootstrap, topic, db.raw, "orders", str(tmp_path / "cp"), str(tmp_path / "job")]
    flags = ["100", "start", "metrics", "versioned"]
    job = Job([*argv, *flags], tmp_path / "job.log", {"SPARK_REMOTE": connect_server.url})
    try:
        job.wait_for_output("route: ", 180)
        address, sink = job.output().split("metrics ", 1)[1].split()[:2]
        _observe(address, sink, bootstrap, topic)
    finally:
        job.kill9()
