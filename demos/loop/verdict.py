"""The demo's checks over what came out, as plain functions of what was read.

The expected events are the committed input, read back read_committed (not
what the filler believes it sent): every one must come out once, squared, in
its account's order, and nothing else may.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from outbox.verify.findings import Record, check, sequence


@dataclass(frozen=True)
class Out:
    """One committed output record, as the demo reads it."""

    partition: int
    offset: int
    key: str | None
    value: bytes | None


@dataclass
class Verdict:
    committed_in: int
    redelivered_in: int
    published: int
    duplicates: int
    missing: int
    out_of_order: int
    leaked: int
    wrong: int
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.committed_in > 0 and not (
            self.duplicates or self.missing or self.out_of_order or self.leaked or self.wrong
        )


def committed_events(values: Iterable[bytes | None]) -> tuple[dict[str, dict], int]:
    """Distinct committed input events by id, and how many records were redeliveries."""
    events: dict[str, dict] = {}
    copies = 0
    for value in values:
        doc = json.loads(value or b"{}")
        if doc["event_id"] in events:
            copies += 1
        events.setdefault(doc["event_id"], doc)
    return events, copies


def judge(inputs: Mapping[str, dict], redelivered: int, outputs: Sequence[Out]) -> Verdict:
    docs = [json.loads(o.value) if o.value else {} for o in outputs]
    records = [
        Record(o.partition, o.offset, o.key, d.get("event_id"), sequence(str(d.get("seq"))))
        for o, d in zip(outputs, docs, strict=True)
    ]
    report = check(records, expected=inputs.keys())
    counts = report.counts()
    wrong = [d for d in docs if d.get("event_id") in inputs and not _right(inputs[d["event_id"]], d)]
    examples = [f.line() for f in report.findings[:5]] + [f"wrong: {d}" for d in wrong[:5]]
    return Verdict(
        committed_in=len(inputs),
        redelivered_in=redelivered,
        published=len(outputs),
        duplicates=counts.get("duplicate", 0),
        missing=counts.get("missing", 0),
        out_of_order=counts.get("out-of-order", 0) + counts.get("split-key", 0),
        leaked=counts.get("leaked", 0) + counts.get("no-id", 0),
        wrong=len(wrong),
        examples=examples,
    )


def _right(source: dict, out: dict) -> bool:
    n = source["n"]
    return (out.get("account"), out.get("seq"), out.get("n"), out.get("square")) == (
        source["account"],
        source["seq"],
        n,
        n * n,
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank; None of nothing."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
