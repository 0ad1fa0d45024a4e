"""Every publisher timed the same way: at one read_committed consumer, in a process of its own.

A publisher's own counter is no common clock: the relay counted what it had
committed, Debezium was timed at a reader, and the raw producer by the sum of
its commits. Here each one is started after the reader has its partitions,
and the reader stamps three moments, each with the machine's CPU counters:
the first record read (start-up ends), the `skip`-th (the steady state
starts, as the first batch is left out) and the last. So the rate is records
read over wall time, and CPU per event counts the steady state only: start-up
(a JVM, a producer's `init_transactions`, rows loaded into memory) is
reported apart. The reader runs in its own process so that no publisher
shares its interpreter with it.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, cast

from confluent_kafka import Consumer
from cpu import Mark  # bench/cpu.py

from outbox.core.kafka import client_settings


def reader(bootstrap: str) -> Consumer:
    """A read_committed consumer of a group of its own, from the start of what it is given."""
    return Consumer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4()}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                # The broker wakes a waiting fetch when a commit marker moves the last stable
                # offset; a shorter wait only makes it answer empty fetches. At 5 ms they
                # cost the broker half a core with nothing written (measured, 2 cores), a
                # quarter of this machine taken from the runs the reader was timing.
                "fetch.wait.max.ms": 100,
            },
            "consumer",
        )
    )


def _read(bootstrap: str, topic: str, count: int, skip: int, seconds: float, out: Connection) -> None:
    """In the reader's process: read until `count` distinct event ids arrived; send the marks."""
    consumer = reader(bootstrap)
    consumer.subscribe([topic])
    while not consumer.assignment():
        consumer.poll(0.05)
    out.send("ready")
    seen: set[bytes] = set()
    records, marks = 0, {}
    deadline = time.monotonic() + seconds
    while len(seen) < count and time.monotonic() < deadline:
        # In bulk: a record is stamped at most 5 ms late, the same for every publisher.
        for m in consumer.consume(2000, 0.005):
            if m.error() is None:
                records += 1
                # A consumer's headers are a list of pairs; every publisher's event id is bytes.
                for name, value in cast("list[tuple[str, bytes]] | None", m.headers()) or ():
                    if name == "event_id":
                        seen.add(value)
                        break
        if seen and "first" not in marks:
            marks["first"] = (len(seen), Mark.now())
        if len(seen) > skip and "steady" not in marks:
            marks["steady"] = (len(seen), Mark.now())
    marks["last"] = (len(seen), Mark.now())
    consumer.close()
    out.send({"marks": marks, "records": records, "distinct": len(seen)})


def timed(
    bootstrap: str,
    topic: str,
    count: int,
    skip: int,
    start: Callable[[], None],
    stop: Callable[[], None],
    seconds: float = 600.0,
) -> dict[str, Any]:
    """Start a publisher once the reader is assigned, and time it at the reader.

    Returns the steady rate (events after the first `skip`, over wall time), the machine's CPU per
    event in that time and by component, start-up (publisher started -> first record read) in
    seconds, and duplicates read.
    """
    context = multiprocessing.get_context("spawn")  # no fork of a process with Kafka clients' threads
    ours, theirs = context.Pipe()
    args = (bootstrap, topic, count, skip, seconds, theirs)
    process = context.Process(target=_read, args=args, daemon=True)
    process.start()
    try:
        if not ours.poll(60) or ours.recv() != "ready":
            raise SystemExit(f"the bench's reader of {topic} got no partition in 60 s")
        begun = Mark.now()
        start()
        if not ours.poll(seconds + 30):
            raise SystemExit(f"the bench's reader of {topic} did not answer in {seconds + 30:.0f} s")
        read = ours.recv()
    finally:
        stop()
        process.join(30)
        if process.is_alive():
            process.kill()
    marks = read["marks"]
    if read["distinct"] < count:
        raise SystemExit(f"{read['distinct']:,} of {count:,} events read from {topic} in {seconds:.0f} s")
    if "steady" not in marks or marks["steady"][0] >= count:
        raise SystemExit(f"all {count:,} events of {topic} arrived at once: nothing to time (more --events)")
    (read_before, since), (_, last) = marks["steady"], marks["last"]
    steady, startup = last.since(since), marks["first"][1].since(begun)
    timed_events = count - read_before
    return {
        "steady_per_s": timed_events / steady.wall_s,
        "cpu_us_per_event": steady.cpu_us_per(timed_events),
        "cpu_us_by_component": steady.components_us_per(timed_events),
        "cores_busy": steady.cores_busy(),
        "startup_s": startup.wall_s,
        "duplicates": read["records"] - read["distinct"],
    }
