"""Partitions that stand still: an open transaction's, or one without a leader.

A transaction opened and never finished holds every read_committed reader of
its partition at its first offset. The source reports each partition's gap
(high watermark minus last stable offset) in its progress, and warns once
when a gap has stood still longer than the broker lets a transaction live
(`transaction.max.timeout.ms`): that transaction will not end by itself (a
hanging one), or its producer is stuck.

A partition without a leader (the brokers of all its replicas down) is read
around: a stream reads the other partitions and holds it where it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class Stall:
    lso: int  # where the last stable offset stands
    since: float  # when it was first seen there behind the high watermark
    warned: bool = False


def watch(
    stalls: Mapping[TopicPartitionKey, Stall],
    lso: Mapping[TopicPartitionKey, int],
    hw: Mapping[TopicPartitionKey, int],
    now: float,
    limit_s: float,
) -> tuple[dict[TopicPartitionKey, Stall], list[str]]:
    """The stalls now, and a warning for each that has just outlasted `limit_s`."""
    out, warnings = {}, []
    for tp, stable in sorted(lso.items()):
        if hw.get(tp, stable) <= stable:
            continue  # nothing uncommitted: no stall
        before = stalls.get(tp)
        stall = before if before is not None and before.lso == stable else Stall(stable, now)
        if not stall.warned and now - stall.since > limit_s:
            topic, partition = tp
            warnings.append(
                f"{topic}-{partition}: the last stable offset has stood at {stable} for"
                f" {now - stall.since:.0f} s, {hw[tp] - stable} records behind the high watermark: a"
                f" transaction has been open longer than the broker lets one live ({limit_s:.0f} s), and"
                f" read_committed readers wait for it; `outbox transactions {topic}` names it"
            )
            stall = replace(stall, warned=True)
        out[tp] = stall
    return out, warnings


def gaps(
    lso: Mapping[TopicPartitionKey, int], hw: Mapping[TopicPartitionKey, int]
) -> dict[str, dict[str, int]]:
    """Records not yet readable read_committed, per topic and partition (only where there are some)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), stable in sorted(lso.items()):
        if hw.get((topic, partition), stable) > stable:
            out.setdefault(topic, {})[str(partition)] = hw[topic, partition] - stable
    return out


@dataclass(frozen=True)
class Leaderless:
    since: float  # when the partition was first found without a leader
    said: bool = False


def leaderless(
    before: Mapping[TopicPartitionKey, Leaderless],
    waiting: list[TopicPartitionKey],
    now: float,
    say_after: float,
) -> tuple[dict[TopicPartitionKey, Leaderless], list[str]]:
    """The partitions a stream reads around while they have no leader, and the lines to say: one
    for those that have waited `say_after` seconds (an election passes sooner, unsaid), and one when
    those have a leader again."""
    out = {tp: before.get(tp, Leaderless(now)) for tp in waiting}
    lines = []
    due = sorted(tp for tp, w in out.items() if not w.said and now - w.since >= say_after)
    if due:
        lines.append(
            f"{names(due)}: no leader for {now - min(out[tp].since for tp in due):.0f}s (the brokers of"
            " its replicas are down); reading the other partitions meanwhile, and it once it has a leader"
            " (option unavailableTimeoutMs)"
        )
        out.update({tp: replace(out[tp], said=True) for tp in due})
    back = sorted(tp for tp, w in before.items() if tp not in out and w.said)
    if back:
        lines.append(f"{names(back)}: a leader again after {now - min(before[tp].since for tp in back):.0f}s")
    return out, lines


def names(partitions: list[TopicPartitionKey]) -> str:
    """'t-0, t-1, t-2 and 4 more'."""
    said = [f"{t}-{p}" for t, p in sorted(partitions)]
    return ", ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")
