"""Our relay as the bench runs it: `outbox relay` processes (timed through the backlog, in the latency
runs, killed -9) and the relay in-process, each with where its time went from its own metrics."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from outbox.core.config import DatabaseUrl
from outbox.relay import Relay, RelaySettings
from outbox_dev.process import free_port, spawn


def relay_spawn(
    url: DatabaseUrl, bootstrap: str, name: str, log: Path, metrics: str, *flags: str
) -> subprocess.Popen[bytes]:
    """`python -m outbox relay --name NAME` as a child of this process, its output in `log`."""
    env = {**os.environ, "DATABASE_URL": url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    argv = [sys.executable, "-m", "outbox", "relay", "--name", name, "--metrics-address", metrics, *flags]
    return spawn(argv, log, die_with_parent=signal.SIGKILL, env=env)


def _get(address: str, path: str) -> str | None:
    """The body of http://address/path (any status), or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as refused:  # /readyz says 503 until the relay is active
        return str(refused.read().decode())
    except OSError:
        return None


class RelayProcess:
    """`outbox relay` in its own process, as users run it, under a new name with cleanup off (so it
    publishes every row): started, and at its stop, where its publishing thread's time went."""

    def __init__(self, url: DatabaseUrl, bootstrap: str, work: Path, batch: int, exactly_once: bool) -> None:
        self.url, self.bootstrap, self.work = url, bootstrap, work
        self.flags = ["--no-cleanup", "--batch-size", str(batch)]
        self.flags += ["--delivery", "exactly-once" if exactly_once else "at-least-once"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        self.steps: dict[str, float] = {}  # step -> seconds, over the whole run

    def start(self) -> None:
        name, self.address = f"bench-{uuid.uuid4().hex[:8]}", f"127.0.0.1:{free_port()}"
        log = self.work / f"{name}.log"
        self.proc = relay_spawn(self.url, self.bootstrap, name, log, self.address, *self.flags)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.steps = {
            s.labels["step"]: s.value
            for family in text_string_to_metric_families(_get(self.address, "/metrics") or "")
            for s in family.samples
            if s.name == "outbox_relay_step_seconds_total"
        }
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(30)
        self.proc = None


@contextlib.contextmanager
def our_relay(
    url: DatabaseUrl, bootstrap: str, work: Path, cleanup: bool = True
) -> Iterator[dict[str, float]]:
    """`outbox relay` in its own process, as users run it and as Debezium runs in its JVM;
    yields a dict that gets, at the end, where its batches spent their time (its /metrics)."""
    name, address = f"bench-lat-{uuid.uuid4().hex[:6]}", f"127.0.0.1:{free_port()}"
    log = work / f"{name}.log"
    proc = relay_spawn(url, bootstrap, name, log, address, *([] if cleanup else ["--no-cleanup"]))
    stats: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 60
        while (_get(address, "/readyz") or "").strip() != "active":
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the relay did not become active in 60 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield stats
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(_get(address, "/metrics") or "")
            for s in family.samples
        }
        for step, plural in (("fetch", "fetches"), ("transaction", "transactions"), ("cleanup", "cleanups")):
            count = samples.get(f"outbox_relay_{step}_seconds_count", 0.0)
            total = samples.get(f"outbox_relay_{step}_seconds_sum", 0.0)
            stats[f"{step}_ms_mean"] = round(total / count * 1000, 1) if count else 0.0
            stats[plural] = count
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def relay_process(
    url: DatabaseUrl, bootstrap: str, work: Path, delivery: str = "exactly-once", *flags: str
) -> tuple[Callable[[], None], Callable[[], None]]:
    """`outbox relay` as a child process: (start, kill -9), for the fault comparison."""
    name = f"bench-fault-{uuid.uuid4().hex[:6]}"
    proc: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        log = work / f"{name}.log"
        proc.append(relay_spawn(url, bootstrap, name, log, "off", "--delivery", delivery, *flags))

    def kill() -> None:
        if proc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc[-1].pid, signal.SIGKILL)
            proc.pop().wait(30)

    return start, kill


def relay_run(settings: RelaySettings, count: int) -> dict[str, Any]:
    """Run the relay until it has published `count` rows: its rate over the rows after its first
    batch, and where its time went (us per event, summed over its batches)."""
    relay = Relay(settings)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    labels = {"relay": settings.name, "shard": "0/1"}

    def sample(metric: str) -> float:
        return relay.metrics.registry.get_sample_value(metric, labels) or 0.0

    def until(events: float) -> None:
        # Sampled every 5 ms: a batch takes 10-100 ms here, and the rate is timed from the first.
        while sample("outbox_relay_events_published_total") < events:
            time.sleep(0.005)
            if not thread.is_alive():
                raise SystemExit(f"relay {settings.name} stopped early")

    until(min(settings.batch_size, count))
    t0, first = time.perf_counter(), sample("outbox_relay_events_published_total")
    until(count)
    elapsed = time.perf_counter() - t0
    relay.stop.set()
    thread.join(30)
    if first >= count:
        raise SystemExit(
            f"relay {settings.name} published all {count:,} rows before its first batch was timed:"
            " more --events"
        )
    stages = {
        step: sample(f"outbox_relay_{step}_seconds_sum") / count * 1e6 for step in ("fetch", "transaction")
    }
    return {"steady_per_s": (count - first) / elapsed, "stages_us": stages}
