"""The source's watch on last stable offsets that stand still behind the high watermark."""

from __future__ import annotations

from sinks.kafka_source.stalls import Stall, gaps, watch

A0, A1 = ("a", 0), ("a", 1)


def test_a_stall_is_warned_once_after_the_limit_and_forgotten_when_the_lso_moves() -> None:
    stalls, warnings = watch({}, {A0: 10, A1: 5}, {A0: 14, A1: 5}, now=100.0, limit_s=60)
    assert stalls == {A0: Stall(10, 100.0)} and warnings == []
    stalls, warnings = watch(stalls, {A0: 10}, {A0: 20}, now=150.0, limit_s=60)
    assert warnings == []
    stalls, warnings = watch(stalls, {A0: 10}, {A0: 20}, now=161.0, limit_s=60)
    assert warnings == [
        "a-0: the last stable offset has stood at 10 for 61 s, 10 records behind the high watermark: a"
        " transaction has been open longer than the broker lets one live (60 s), and read_committed"
        " readers wait for it; `outbox transactions a` names it"
    ]
    stalls, warnings = watch(stalls, {A0: 10}, {A0: 20}, now=500.0, limit_s=60)
    assert warnings == [] and stalls[A0].warned  # once
    stalls, warnings = watch(stalls, {A0: 11}, {A0: 20}, now=501.0, limit_s=60)
    assert stalls == {A0: Stall(11, 501.0)}  # it moved: a new watch
    assert watch(stalls, {A0: 20}, {A0: 20}, now=502.0, limit_s=60) == ({}, [])


def test_gaps_only_where_records_wait() -> None:
    assert gaps({A0: 10, A1: 5, ("b", 0): 3}, {A0: 14, A1: 5, ("b", 0): 9}) == {"a": {"0": 4}, "b": {"0": 6}}
