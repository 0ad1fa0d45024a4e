"""What `outbox status` shows, as plain values; rendering them is a pure function of them and the time."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from outbox.jsonable import plain


@dataclass(frozen=True)
class Waiting:
    """Committed outbox rows one relay shard has not published yet, on one topic."""

    topic: str
    rows: int
    oldest: datetime


@dataclass(frozen=True)
class RelayShard:
    relay: str
    shard: str  # I/N
    running: bool
    base: str  # the snapshot whose rows are all in Kafka
    updated_at: datetime
    waiting: tuple[Waiting, ...] = ()

    @property
    def rows_waiting(self) -> int:
        return sum(w.rows for w in self.waiting)

    def oldest(self) -> datetime | None:
        return min((w.oldest for w in self.waiting), default=None)


@dataclass(frozen=True)
class LedgerPartition:
    """Where a sink stands on one topic-partition, and where the topic ends (None: Kafka not asked)."""

    sink: str
    topic: str
    partition: int
    next_offset: int
    updated_at: datetime
    high_watermark: int | None = None
    stable: int | None = None  # the Last Stable Offset: what read_committed readers can reach

    @property
    def lag(self) -> int | None:
        """Records not applied yet, open transactions' included: the high watermark minus the next offset."""
        return None if self.high_watermark is None else max(self.high_watermark - self.next_offset, 0)

    @property
    def held_back(self) -> int | None:
        """Records beyond the LSO: no read_committed reader gets them until a transaction ends."""
        if self.high_watermark is None or self.stable is None:
            return None
        return max(self.high_watermark - self.stable, 0)


@dataclass(frozen=True)
class DeadLetters:
    kind: str  # "sink" or "relay"
    name: str
    rows: int
    last: datetime


@dataclass(frozen=True)
class Status:
    schema: str
    outbox_rows: int  # in the table, published or not (published rows wait for cleanup)
    relays: tuple[RelayShard, ...] = ()
    ledgers: tuple[LedgerPartition, ...] = ()
    dead_letters: tuple[DeadLetters, ...] = ()
    kafka: str | None = None  # bootstrap servers asked, or None
    kafka_error: str | None = None  # why the topics' ends are missing
    transactions: tuple[str, ...] | None = None  # lines of `outbox transactions`; None: not asked

    @property
    def topics(self) -> list[str]:
        """The topics the loop touches: the sinks' inputs and the relays' outputs."""
        found = {p.topic for p in self.ledgers} | {w.topic for r in self.relays for w in r.waiting}
        return sorted(found)


def _age(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "-"
    seconds = max((now - then).total_seconds(), 0.0)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def lines(status: Status, now: datetime) -> list[str]:
    """The human screen: a section per part of the loop, a table in each."""
    out = [f"outbox status: schema {status.schema}, at {now:%Y-%m-%d %H:%M:%S %Z}", ""]
    out.append(f"relays: {status.outbox_rows} row(s) in the outbox table")
    if status.relays:
        rows = [["RELAY", "SHARD", "STATE", "WAITING", "OLDEST WAITING", "POSITION MOVED"]]
        for r in status.relays:
            rows.append(
                [
                    r.relay,
                    r.shard,
                    "running" if r.running else "stopped",
                    str(r.rows_waiting),
                    _age(r.oldest(), now),
                    f"{_age(r.updated_at, now)} ago",
                ]
            )
        out += _table(rows)
    else:
        out.append("  no relay has published this outbox yet")

    out.append("")
    out.append("sinks:" + ("" if status.kafka else " (topic ends not asked: give --bootstrap-servers)"))
    if status.kafka_error:
        out.append(f"  topic ends unknown: {status.kafka_error}")
    if status.ledgers:
        rows = [["SINK", "TOPIC-PARTITION", "NEXT OFFSET", "HIGH WATERMARK", "LAG", "BEYOND LSO", "APPLIED"]]
        for p in status.ledgers:
            rows.append(
                [
                    p.sink,
                    f"{p.topic}-{p.partition}",
                    str(p.next_offset),
                    "-" if p.high_watermark is None else str(p.high_watermark),
                    "-" if p.lag is None else str(p.lag),
                    "-" if p.held_back is None else str(p.held_back),
                    f"{_age(p.updated_at, now)} ago",
                ]
            )
        out += _table(rows)
    else:
        out.append("  no sink has applied a batch here yet")

    out.append("")
    out.append("dead letters:")
    if status.dead_letters:
        rows = [["KIND", "NAME", "ROWS", "LAST"]]
        rows += [[d.kind, d.name, str(d.rows), f"{_age(d.last, now)} ago"] for d in status.dead_letters]
        out += _table(rows)
    else:
        out.append("  none")

    if status.transactions is not None:
        out.append("")
        out.append("transactions on these topics:")
        out += [f"  {line}" for line in status.transactions] or ["  none open"]
    return out


def as_json(status: Status) -> dict[str, Any]:
    """The same, as one JSON-ready object; times as ISO 8601, derived figures included."""

    doc: dict[str, Any] = plain(asdict(status))
    for shard, r in zip(doc["relays"], status.relays, strict=True):
        shard["rows_waiting"] = r.rows_waiting
        oldest = r.oldest()
        shard["oldest_waiting"] = oldest.isoformat() if oldest else None
    for part, p in zip(doc["ledgers"], status.ledgers, strict=True):
        part["lag"], part["beyond_lso"] = p.lag, p.held_back
    return doc
