"""Prometheus metrics and the relay's probes, served from a background thread.

Two probes, for two actions. /readyz (and /healthz, its older name) is 200
while the relay is active or standing by with its connections up, 503 while
it starts, is halted on a poison row, or waits for a service it cannot
reach: what to alert on and to count as available, never a reason to
restart it, which fixes none of these. /livez is 200 while the relay's loop
turns: it fails only when the loop has not turned for longer than the
relay's own bound on a quiet session (`wedged_after`, its settings'
`silence`) past the wait it said it was in, the one thing a restart cures.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from outbox.errors import error

disable_created_metrics()  # the *_created series only add noise for a long-running daemon

# A batch's steps on the publishing thread, in order: waiting for its rows (read ahead while the
# batch before was published, so mostly hidden), checking them, producing the records and the
# position, committing the Kafka transaction (at least once: the flush), and recording the
# published base for the other relays (about once a second).
STEPS = ("read", "check", "produce", "commit", "record")

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class RelayMetrics:
    def __init__(self, relay: str, shard: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"relay": relay, "shard": shard}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, list(labels), registry=self.registry, buckets=_BUCKETS).labels(
                **labels
            )

        self.published = counter("outbox_relay_events_published", "Outbox rows published to Kafka")
        self.batches = counter("outbox_relay_batches", "Kafka transactions committed")
        self.aborts = counter("outbox_relay_aborts", "Transactions aborted on a refused record")
        self.dead_letters = counter("outbox_relay_dead_letters", "Rows moved to relay_dead_letters")
        self.cleaned = counter("outbox_relay_rows_deleted", "Published rows deleted by cleanup")
        self._oldest: float | None = None
        lag = gauge("outbox_relay_lag_seconds", "Age of the oldest committed row not yet published")
        # Aged at each scrape: a row the relay holds, halted on it or cut off mid-batch, grows older.
        lag.set_function(lambda: time.time() - self._oldest if self._oldest is not None else 0.0)
        self.active = gauge("outbox_relay_active", "1 while this instance holds the shard's lock")
        self.halted = gauge("outbox_relay_halted", "1 while publishing is stopped on a poison row")
        self.commit_seconds = histogram(
            "outbox_relay_transaction_seconds", "Time to produce a batch and commit its Kafka transaction"
        )
        self.fetch_seconds = histogram(
            "outbox_relay_fetch_seconds", "Time to read a batch of rows from the outbox table"
        )
        self.cleanup_seconds = histogram(
            "outbox_relay_cleanup_seconds", "Time to delete published rows (on the cleaner's own session)"
        )
        # Where the publishing thread's time goes, batch by batch: the steps a batch waits on in turn.
        steps = Counter(
            "outbox_relay_step_seconds",
            "Time the publishing thread spent in each step of its batches",
            [*labels, "step"],
            registry=self.registry,
        )
        self.steps = {step: steps.labels(**labels, step=step) for step in STEPS}
        self._health = (False, "starting")
        self._due = time.monotonic()  # when the loop is next due to say its state
        self._lock = threading.Lock()

    def waiting(self, oldest: float | None) -> None:
        """The commit time of the oldest row read and not yet published (None: none is)."""
        self._oldest = oldest

    def health(self, ok: bool, state: str, *, waits: float = 0.0) -> None:
        """The loop's state, said at each turn of it; `waits`: how long it now sleeps on purpose."""
        with self._lock:
            self._health = (ok, state)
            self._due = time.monotonic() + waits

    def read_health(self) -> tuple[bool, str]:
        with self._lock:
            return self._health

    def read_liveness(self, wedged_after: float) -> tuple[bool, str]:
        with self._lock:
            due, (_, state) = self._due, self._health
        return liveness(time.monotonic() - due, wedged_after, state)


def liveness(late: float, wedged_after: float, state: str) -> tuple[bool, str]:
    """Whether a loop `late` seconds past the end of the wait it said it was in is still alive."""
    if late <= wedged_after:
        return True, "alive"
    said = f"wedged: the loop has not turned for {late:.0f}s past its wait (bound {wedged_after:.0f}s)"
    return False, f"{said}; last: {state}"


def serve(metrics: RelayMetrics, address: str, wedged_after: float) -> ThreadingHTTPServer:
    """Serve /metrics, /livez and /readyz (/healthz) on host:port (port 0: any free one) in a
    daemon thread."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise error("RELAY_METRICS_ADDRESS_MALFORMED", address=address)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path in ("/readyz", "/healthz", "/livez"):
                ok, state = metrics.read_liveness(wedged_after)  # a wedged relay is not ready either
                if ok and self.path != "/livez":
                    ok, state = metrics.read_health()
                self._send(200 if ok else 503, f"{state}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"try /metrics, /livez or /readyz\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
            pass

    try:
        server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
    except OSError as exc:
        raise error("RELAY_METRICS_ADDRESS_UNAVAILABLE", address=address, reason=exc.strerror) from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
