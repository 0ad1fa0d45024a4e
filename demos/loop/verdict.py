"""The demo's checks over what came out, as plain functions of what was read.

The expected events are the committed input, read back read_committed (not
what the filler believes it sent): every one must come out once, squared, in
its account's order, and nothing else may.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Input:
    """The committed input as read back: each distinct event by id and where its first copy is,
    how many records were redelivered copies, and the poison records (a number that is not one),
    which the sink dead-letters."""

    events: dict[str, dict] = field(default_factory=dict)
    at: dict[str, tuple[int, int]] = field(default_factory=dict)  # event id -> partition, offset
    copies: int = 0
    poison: dict[str, dict] = field(default_factory=dict)


def committed_events(
    records: Iterable[tuple[int, int, bytes | None]],
    decode: Callable[[bytes | None], dict[str, Any]] = lambda v: dict(json.loads(v or b"{}")),
) -> Input:
    """From the input's committed records, as (partition, offset, value); `decode` reads a value."""
    found = Input()
    for partition, offset, value in records:
        doc = decode(value)
        if not isinstance(doc.get("n"), int):
            found.poison[doc["event_id"]] = doc
        elif doc["event_id"] in found.events:
            found.copies += 1
        else:
            found.events[doc["event_id"]] = doc
        found.at.setdefault(doc["event_id"], (partition, offset))
    return found


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
