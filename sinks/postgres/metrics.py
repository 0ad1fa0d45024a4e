"""Prometheus metrics for a sink's streaming query, fed from Spark's own progress.

A StreamingQueryListener hears each batch's progress in the driver; a Spark
Connect client reads its query's recent progress once a second instead
(pyspark 4.3's client drops every listener for good once the server sends
its listener stream a Python accumulator's update: UNKNOWN_RESPONSE, seen
with a sink applying in the tasks). From the progress it
takes the batch's duration, and per topic-partition the lag (the source's
latest offset minus the batch's end) and, from kafka_rc, the records an open
transaction holds past the LSO (`#uncommitted`). What the sink did comes
from its last batch's result (`sink.last`: in the driver's memory, or as a
Connect client reads it beside the batch's record), which is there before
the batch's progress is sent. A query with nothing to read reports no
progress (Spark sends an idle event instead): the gauges keep the values of
its last batch until the next one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from sinks.errors import error
from sinks.postgres.apply import BatchResult
from sinks.postgres.spark_plan import is_connect

log = logging.getLogger("sinks.postgres")
_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
UNCOMMITTED = "#uncommitted"  # kafka_rc's progress key for records past the LSO


class Measured(Protocol):
    """What the metrics read of a sink (a PostgresSink): its name, its query, its last batch."""

    @property
    def name(self) -> str: ...
    @property
    def query(self) -> StreamingQuery | None: ...
    @property
    def last(self) -> BatchResult | None: ...


class SinkMetrics(StreamingQueryListener):
    """The sink's query's metrics; `serve` it, and add it to the session's streams' listeners."""

    def __init__(self, sink: Measured, registry: CollectorRegistry | None = None) -> None:
        self.sink = sink
        self.registry = registry or CollectorRegistry()
        name = {"sink": sink.name}

        def counter(metric: str, doc: str) -> Any:
            return Counter(metric, doc, ["sink"], registry=self.registry).labels(**name)

        self.applied = counter("outbox_sink_events_applied", "Events that wrote or deleted a row")
        self.skipped = counter(
            "outbox_sink_events_skipped",
            "Events that changed nothing: already applied (the ledger), duplicates, stale versions",
        )
        self.replayed = counter("outbox_sink_events_replayed", "Of those, already applied by the ledger")
        self.duplicates = counter("outbox_sink_events_duplicates", "Of those, held by their row already")
        self.stale = counter("outbox_sink_events_stale", "Of those, refused: their row held a newer version")
        self.dead = counter("outbox_sink_dead_letters", "Events moved to sink_dead_letters")
        self.batches = counter("outbox_sink_batches", "Micro-batches applied")
        self.seconds = Histogram(
            "outbox_sink_batch_seconds",
            "A micro-batch's duration",
            ["sink"],
            registry=self.registry,
            buckets=_BUCKETS,
        ).labels(**name)
        labels = ["sink", "topic", "partition"]
        self.lag = Gauge(
            "outbox_sink_lag", "Latest offset minus the last batch's end", labels, registry=self.registry
        )
        held = "Records past the LSO, held back by open transactions (kafka_rc)"
        self.held = Gauge("outbox_sink_uncommitted", held, labels, registry=self.registry)
        self._counted = -1
        self.address = ""  # where serve() serves them
        self._spark: Any = None  # the session listened to, classic
        self._stopping = threading.Event()
        self._poller: threading.Thread | None = None  # Spark Connect

    def listen(self, spark: Any, every: float = 1.0) -> None:
        """Hear each batch's progress: as a listener of a classic session; on Spark Connect by
        reading the query's recent progress `every` seconds."""
        if not is_connect(spark):
            spark.streams.addListener(self)
            self._spark = spark
            return
        self._poller = threading.Thread(target=self._poll, args=(every,), name="sink-metrics", daemon=True)
        self._poller.start()

    def _poll(self, every: float) -> None:
        seen, failing = -1, False
        while not self._stopping.wait(every):
            query = self.sink.query
            if query is None:
                continue
            try:
                progress = query.recentProgress
            except Exception as exc:  # the server restarting: say so once, keep asking
                if not failing:
                    log.warning("sink %s: metrics cannot read the query's progress: %s", self.sink.name, exc)
                failing = True
                continue
            failing = False
            for p in progress:
                if p.batchId > seen:
                    seen = p.batchId
                    self._heard(p)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        query = self.sink.query
        if query is None or str(progress.id) != str(query.id):
            return  # another query of the session
        self._heard(progress)

    def _heard(self, progress: Any) -> None:
        try:
            self.observe(progress.batchId, progress.batchDuration / 1000, progress.sources)
        except Exception as exc:  # a listener that raises is dropped by Spark: say why, keep going
            log.warning(
                "sink %s: metrics of batch %s not recorded: %s", self.sink.name, progress.batchId, exc
            )

    def observe(self, batch_id: int, seconds: float, sources: Any) -> None:
        for source in sources:
            self._offsets(_parsed(source.latestOffset), _parsed(source.endOffset))
        result = self.sink.last
        if result is None or result.batch_id <= self._counted:
            return  # a batch with no data (no result), or counted already
        self._counted = result.batch_id
        self.batches.inc()
        self.seconds.observe(seconds)
        self.applied.inc(result.upserted + result.deleted)
        self.replayed.inc(result.replayed)
        self.duplicates.inc(result.duplicates)
        self.stale.inc(result.stale)
        self.skipped.inc(result.staged - result.upserted - result.deleted - result.dead)
        self.dead.inc(result.dead)

    def _offsets(self, latest: Mapping[str, Any], end: Mapping[str, Any]) -> None:
        for topic, parts in latest.items():
            if topic.startswith("#"):
                continue
            for partition, offset in parts.items():
                done = end.get(topic, {}).get(partition, offset)
                self.lag.labels(self.sink.name, topic, partition).set(max(int(offset) - int(done), 0))
                held = latest.get(UNCOMMITTED, {}).get(topic, {}).get(partition, 0)
                self.held.labels(self.sink.name, topic, partition).set(int(held))

    def serve(self, address: str) -> str:
        """Serve /metrics on HOST:PORT (port 0: any free one) in a daemon thread; returns host:port."""
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise error("SINK_METRICS_ADDRESS_INVALID", address=address)
        try:
            server, _ = start_http_server(
                int(port), addr=host.strip("[]") or "0.0.0.0", registry=self.registry
            )
        except OSError as exc:
            raise error("SINK_METRICS_CANNOT_SERVE", address=address, reason=exc.strerror) from None
        self._server = server
        return f"{host}:{server.server_port}"

    def close(self) -> None:
        """Stop listening and serving."""
        self._stopping.set()
        if self._spark is not None:
            self._spark.streams.removeListener(self)
            self._spark = None
        if self._poller is not None:
            self._poller.join(10)
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()


def _parsed(offsets: str | None) -> dict[str, Any]:
    if not offsets:
        return {}
    doc = json.loads(offsets)
    return doc if isinstance(doc, dict) else {}
