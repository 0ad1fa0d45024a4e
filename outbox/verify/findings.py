"""What is wrong with a topic's committed records: plain decisions over records already read.

A record is (partition, offset, key, event id, sequence). The checks:

- duplicate: an event id seen more than once;
- out of order: for one key, a sequence lower than the one before it, in
  offset order within the key's partition (a key in two partitions is itself
  reported, since Kafka orders nothing across partitions);
- missing: an expected event id never seen;
- leaked: an event id seen that was not expected (e.g. from an aborted
  transaction of the source);
- no-sequence: with an order field asked for, a record (not a tombstone)
  whose field holds no number: it could not be checked, so it is said;
- source-no-id: source events with no id, whose presence could not be
  checked. A source event given twice is no finding: an idempotent sink
  meets such repeats by design.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import pairwise


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: str | None
    event_id: str | None
    sequence: Decimal | None = None
    unordered: bool = False  # an order field was asked for, and this record's holds no number


@dataclass(frozen=True)
class Finding:
    kind: str  # duplicate | out-of-order | split-key | missing | leaked | no-id | no-sequence
    detail: str
    where: str = ""

    def line(self) -> str:
        return f"{self.kind}: {self.detail}" + (f" ({self.where})" if self.where else "")


@dataclass
class Report:
    records: int = 0
    findings: list[Finding] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for f in self.findings:
            out[f.kind] += 1
        return dict(out)

    @property
    def ok(self) -> bool:
        return not self.findings


def sequence(text: str | None) -> Decimal | None:
    """A sequence or version as a number; None when absent or not a (finite) number."""
    if text is None:
        return None
    try:
        number = Decimal(text)
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def check(records: Sequence[Record], expected: Iterable[str | None] | None = None) -> Report:
    """expected: the source's event ids (None: an event without one)."""
    report = Report(records=len(records))
    seen: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.unordered:
            report.findings.append(Finding("no-sequence", "the record's order field holds no number", _at(r)))
        if r.event_id is None:
            report.findings.append(Finding("no-id", "record has no event id", _at(r)))
        else:
            seen[r.event_id].append(r)
    for event_id, copies in seen.items():
        if len(copies) > 1:
            where = ", ".join(_at(c) for c in copies)
            report.findings.append(
                Finding("duplicate", f"event {event_id} appears {len(copies)} times", where)
            )
    report.findings += _order(records)
    if expected is not None:
        ids = list(expected)
        wanted = {e for e in ids if e is not None}
        if unknown := ids.count(None):
            report.findings.append(
                Finding(
                    "source-no-id",
                    f"{unknown} source event{' has' if unknown == 1 else 's have'} no id:"
                    " whether published cannot be checked",
                )
            )
        report.findings += [
            Finding("missing", f"event {e} was never published") for e in sorted(wanted - set(seen))
        ]
        for e in sorted(set(seen) - wanted):
            report.findings.append(Finding("leaked", f"event {e} is not in the source", _at(seen[e][0])))
    return report


def _order(records: Sequence[Record]) -> list[Finding]:
    by_key: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.key is not None:
            by_key[r.key].append(r)
    findings = []
    for key, rs in by_key.items():
        partitions = sorted({r.partition for r in rs})
        if len(partitions) > 1:
            findings.append(Finding("split-key", f"key {key!r} is in partitions {partitions}"))
        for p in partitions:
            ordered = sorted(
                (r for r in rs if r.partition == p and r.sequence is not None), key=lambda r: r.offset
            )
            for before, after in pairwise(ordered):
                if after.sequence < before.sequence:  # type: ignore[operator]  # sequences of one topic are all numbers or all text
                    findings.append(
                        Finding(
                            "out-of-order",
                            f"key {key!r}: {after.sequence} after {before.sequence}",
                            f"{_at(before)} then {_at(after)}",
                        )
                    )
    return findings


def _at(r: Record) -> str:
    return f"partition {r.partition} offset {r.offset}"
