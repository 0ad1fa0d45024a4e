"""The source's watch on partitions that stand still: behind an open transaction, or without a leader."""

from __future__ import annotations

from sinks.kafka_source.stalls import Leaderless, Stall, gaps, leaderless, names, watch

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


def test_a_partition_without_a_leader_is_said_once_after_the_wait_and_once_when_led_again() -> None:
    state, lines = leaderless({}, [A1], now=100.0, say_after=30)
    assert state == {A1: Leaderless(100.0)} and lines == []  # an election passes sooner, unsaid
    state, lines = leaderless(state, [A1, A0], now=131.0, say_after=30)
    assert lines == [
        "a-1: no leader for 31s (the brokers of its replicas are down); reading the other partitions"
        " meanwhile, and it once it has a leader (option unavailableTimeoutMs)"
    ]
    assert state == {A1: Leaderless(100.0, said=True), A0: Leaderless(131.0)}
    state, lines = leaderless(state, [A1, A0], now=140.0, say_after=30)
    assert lines == []  # once
    state, lines = leaderless(state, [A0], now=150.0, say_after=30)
    assert lines == ["a-1: a leader again after 50s"] and state == {A0: Leaderless(131.0)}
    assert leaderless(state, [], now=151.0, say_after=30) == ({}, [])  # never said: nothing to end


def test_names_are_few() -> None:
    assert names([("b", 0), ("a", 2), ("a", 10)]) == "a-2, a-10, b-0"  # by partition number
    assert names([("t", p) for p in range(5)]) == "t-0, t-1, t-2 and 2 more"
