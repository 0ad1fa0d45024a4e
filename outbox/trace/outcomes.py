"""What the sink did with each record: decided from a tracing sink's rows, in plain code.

A trace row (migration 0008) says which records one statement applied or
skipped, which were deletes, and which events' rows it wrote or deleted. An
upsert whose event's row the statement wrote was applied; a delete whose row
it deleted, deleted; any other record was skipped: stale when its version is below that of the row
its event's last applied record left, a duplicate when not (the row already
held it, or it deleted a row that was not there).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation


@dataclass(frozen=True)
class TraceRow:
    """A `sink_traces` row, as read: one applying statement."""

    sink: str
    txid: str
    round: int
    applied_at: datetime
    outbox_topic: str | None
    topics: Sequence[str]
    partitions: Sequence[int]
    offsets: Sequence[int]
    events: Sequence[str]  # each record's key as text
    versions: Sequence[str | None] | None
    written: Collection[str] | None  # None: the statement wrote a row for each of its upserts
    deletes: Collection[str]
    removed: Collection[str]
    target: str | None = None  # schema.table (migration 0015); None in a row written before


COLUMNS = "sink, txid::text, round, applied_at, outbox_topic, topics, partitions, offsets, events, versions,"
COLUMNS += " written, deletes, removed, target"
ORDER = "applied_at, txid, round"  # the order the sink applied the rows in


@dataclass(frozen=True)
class Record:
    """One input record the sink applied or skipped, and what it did with it."""

    sink: str
    topic: str
    partition: int
    offset: int
    event: str  # its key as text
    version: str | None
    applied_at: datetime
    txid: str
    round: int
    outbox_topic: str | None
    outcome: str  # "applied", "deleted", "stale" or "duplicate"
    target: str | None = None  # the table, schema.table (None: a trace row of before migration 0015)

    @property
    def wrote_outbox(self) -> bool:
        return self.outbox_topic is not None and self.outcome in ("applied", "deleted")


def records(rows: Sequence[TraceRow], events: Collection[str] | None = None) -> list[Record]:
    """The records of `rows` (those of `events` only, if given), in the order applied, with outcomes.

    rows: in ORDER; within a row, records go by partition and offset.
    """
    last: dict[tuple[str, str | None, str], str | None] = {}  # by sink, table and event
    out = []
    for row in rows:
        wanted = (
            range(len(row.events)) if events is None else [i for i, e in enumerate(row.events) if e in events]
        )
        deletes, removed = set(row.deletes), set(row.removed)
        written = None if row.written is None else set(row.written)
        for i in sorted(wanted, key=lambda i: (row.partitions[i], row.offsets[i])):
            event, version = row.events[i], row.versions[i] if row.versions else None
            row_of = (row.sink, row.target, event)
            seen = last.get(row_of)
            if event in deletes and event in removed:  # the row is gone: nothing is stale against it
                outcome, last[row_of] = "deleted", None
            elif event not in deletes and (written is None or event in written):
                outcome, last[row_of] = "applied", version
            elif version is not None and seen is not None and _below(version, seen):
                outcome = "stale"
            else:
                outcome = "duplicate"
            out.append(
                Record(
                    row.sink,
                    row.topics[i],
                    row.partitions[i],
                    row.offsets[i],
                    event,
                    version,
                    row.applied_at,
                    row.txid,
                    row.round,
                    row.outbox_topic,
                    outcome,
                    row.target,
                )
            )
    return out


def _below(version: str, than: str) -> bool:
    """Versions as the table's text gives them: numbers compared as numbers, anything else as text
    (ISO timestamps sort as text)."""
    try:
        return Decimal(version) < Decimal(than)
    except InvalidOperation:
        return version < than
