"""`outbox verify`'s checks, on records already read: a clean topic passes, each injected fault is found."""

from __future__ import annotations

from decimal import Decimal

import hypothesis.strategies as st
from confluent_kafka import Message
from hypothesis import given

from outbox.verify.findings import Record, check, sequence
from outbox.verify.topic import record


@st.composite
def clean_topics(draw: st.DrawFn) -> list[Record]:
    """Unique ids, each key in one partition, sequences rising per key in offset order."""
    keys = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=30))
    offsets = [0, 0]
    seqs: dict[str, int] = {}
    out = []
    for i, key in enumerate(keys):
        partition = "abcdef".index(key) % 2
        seqs[key] = seqs.get(key, 0) + draw(st.integers(0, 3))
        out.append(Record(partition, offsets[partition], key, f"e{i}", Decimal(seqs[key])))
        offsets[partition] += 1
    return out


@given(clean_topics())
def test_a_clean_topic_has_no_findings(records: list[Record]) -> None:
    assert check(records, {r.event_id for r in records if r.event_id}).findings == []


@given(clean_topics(), st.data())
def test_each_injected_fault_is_found(records: list[Record], data: st.DataObject) -> None:
    victim = data.draw(st.sampled_from(records))
    last = max((r.offset for r in records if r.partition == victim.partition), default=0)
    duplicate = Record(victim.partition, last + 1, victim.key, victim.event_id, None)
    assert [f.kind for f in check([*records, duplicate]).findings] == ["duplicate"]
    expected = {r.event_id for r in records if r.event_id}
    assert [f.kind for f in check([r for r in records if r is not victim], expected).findings] == ["missing"]
    assert [f.kind for f in check(records, expected - {victim.event_id}).findings] == ["leaked"]
    older = Record(victim.partition, last + 1, victim.key, "late", (victim.sequence or Decimal(0)) - 1)
    assert [f.kind for f in check([*records, older]).findings] == ["out-of-order"]


def test_a_record_that_could_not_be_ordered_is_said_not_skipped() -> None:
    records = [Record(0, 0, "k", "e1", Decimal(1)), Record(0, 1, "k", "e2", None, unordered=True)]
    assert [(f.kind, f.where) for f in check(records).findings] == [("no-sequence", "partition 0 offset 1")]


def test_only_finite_numbers_are_sequences() -> None:
    assert [sequence(t) for t in ("3", "-1.5", "NaN", "Infinity", "v3", None)] == [
        Decimal(3),
        Decimal("-1.5"),
        None,
        None,
        None,
        None,
    ]


def test_a_source_event_without_an_id_is_a_finding_a_repeated_one_is_not() -> None:
    records = [Record(0, 0, "k", "e1"), Record(0, 1, "k", "e2")]
    assert check(records, ["e1", "e2", "e2"]).ok  # a source repeat: what an idempotent sink absorbs
    [finding] = check(records, ["e1", None, "e2", None]).findings
    assert (finding.kind, finding.detail.split(":")[0]) == ("source-no-id", "2 source events have no id")


@given(st.lists(st.decimals(allow_nan=False, allow_infinity=False), min_size=2, max_size=2, unique=True))
def test_an_order_field_is_read_as_written_any_decrease_is_found(pair: list[Decimal]) -> None:
    """Parsed as binary floats, versions past about 16 significant digits (1700000000.1234567 and
    ...566, an epoch in seconds to the 10 ns) read as one number: a decrease passed unseen."""
    low, high = sorted(pair)
    values = [f'{{"v": {n}}}'.encode() for n in (high, low)]
    messages = [
        Message(topic="t", partition=0, offset=i, key=b"k", value=v, headers=[("event_id", f"e{i}".encode())])
        for i, v in enumerate(values)
    ]
    records = [record(m, id_header=None, id_field=None, order_field="v") for m in messages]
    assert [r.sequence for r in records] == [high, low]
    assert [f.kind for f in check(records).findings] == ["out-of-order"]
