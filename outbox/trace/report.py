"""An event's path as plain values; rendering is a pure function of them."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from outbox.errors import error
from outbox.jsonable import plain

# What the sink did with an input record (outbox/trace/outcomes.py decides it), as a reader says it.
SAID = {
    "applied": "applied",
    "deleted": "deleted its key's row",
    "duplicate": "skipped: a duplicate (the row already held it)",
    "stale": "skipped: a stale version (the row held a newer one)",
}


@dataclass(frozen=True)
class Published:
    partition: int
    offset: int
    at: datetime


@dataclass(frozen=True)
class OutboxEvent:
    """The outbox event the sink's transaction wrote for one input record, and how far it got."""

    event_id: uuid.UUID
    topic: str
    state: str  # "waiting", "published", "dead-lettered" (by a relay)
    since: datetime | None = None  # waiting: when it was committed to the outbox
    relay: str | None = None  # published: the relay shard's transactional.id; dead-lettered: the relay
    published: Published | None = None  # where it is in the topic, when Kafka was searched and it was found
    error: str | None = None  # dead-lettered: why


@dataclass(frozen=True)
class Applied:
    """One input record of the event and what the sink did with it."""

    sink: str
    topic: str
    partition: int
    offset: int
    outcome: str
    version: str | None
    at: datetime
    outbox: OutboxEvent | None = None
    traceparent: str | None = None  # the input record's W3C trace context header, read from Kafka


@dataclass(frozen=True)
class DeadLetter:
    sink: str
    topic: str | None
    partition: int | None
    offset: int | None
    error: str
    at: datetime


@dataclass(frozen=True)
class Position:
    """One input record's place: `TOPIC:PARTITION:OFFSET` on the command line."""

    topic: str
    partition: int
    offset: int

    @classmethod
    def parse(cls, text: str) -> Position:
        topic, _, rest = text.partition(":")  # a Kafka topic name has no ':'
        partition, _, offset = rest.partition(":")
        if not (topic and partition.isdigit() and offset.isdigit()):
            raise error("TRACE_AT_MALFORMED", text=text)
        return cls(topic, int(partition), int(offset))

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True)
class Trace:
    event: str
    records: tuple[Applied, ...] = ()
    dead_letters: tuple[DeadLetter, ...] = ()
    searched: str | None = None  # why the output topic was not searched, if it was not
    at: Position | None = None  # only the input record there, when the trace was asked for one

    @property
    def found(self) -> bool:
        return bool(self.records or self.dead_letters)

    def only(self, at: Position) -> Trace:
        """The input record at `at` alone: one event's key may have many records."""
        here = (at.topic, at.partition, at.offset)
        return replace(
            self,
            records=tuple(r for r in self.records if (r.topic, r.partition, r.offset) == here),
            dead_letters=tuple(d for d in self.dead_letters if (d.topic, d.partition, d.offset) == here),
            at=at,
        )


def _at(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f"{t:%z}".replace("+0000", "Z")


def _outbox_line(box: OutboxEvent) -> str:
    head = f"outbox event {box.event_id} for {box.topic}:"
    if box.state == "waiting":
        since = _at(box.since) if box.since else "?"
        return f"{head} waiting in the outbox since {since}: no relay has recorded publishing it"
    if box.state == "dead-lettered":
        return f"{head} dead-lettered by relay {box.relay}: {box.error}"
    where = (
        f" as {box.topic}[{box.published.partition}]@{box.published.offset} at {_at(box.published.at)}"
        if box.published
        else ""
    )
    by = f" by transactional.id {box.relay}" if box.relay else ""
    return f"{head} published{where}{by}"


def lines(trace: Trace) -> list[str]:
    if not trace.found:
        where = f" at {trace.at}" if trace.at else ""
        return [
            f"event {trace.event}: no record of it{where}: no tracing sink (PostgresSink(trace=True))"
            " applied it, and no sink dead letter holds it"
        ]
    out = [
        f"event {trace.event}: {len(trace.records)} input record(s), {len(trace.dead_letters)} dead letter(s)"
    ]
    for r in trace.records:
        version = f" at version {r.version}" if r.version is not None and r.outcome == "applied" else ""
        out.append(
            f"  input {r.topic}[{r.partition}]@{r.offset}: sink {r.sink} {SAID.get(r.outcome, r.outcome)}"
            f"{version}, {_at(r.at)}"
        )
        if r.traceparent:
            out.append(f"    traceparent {r.traceparent} (its writer's span)")
        if r.outbox:
            out.append(f"    {_outbox_line(r.outbox)}")
    for d in trace.dead_letters:
        where = f"{d.topic}[{d.partition}]@{d.offset}" if d.topic is not None else "(no Kafka position)"
        out.append(f"  input {where}: sink {d.sink} dead-lettered it, {_at(d.at)}: {d.error}")
    if trace.searched:
        out.append(f"  ({trace.searched})")
    return out


def as_json(trace: Trace) -> dict[str, Any]:
    return {**plain(asdict(trace)), "found": trace.found}
