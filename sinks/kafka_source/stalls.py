"""Partitions whose last stable offset stands still behind their high watermark: an open transaction.

A transaction opened and never finished holds every read_committed reader of
its partition at its first offset. The source reports each partition's gap
(high watermark minus last stable offset) in its progress, and warns once
when a gap has stood still longer than the broker lets a transaction live
(`transaction.max.timeout.ms`): that transaction will not end by itself (a
hanging one), or its producer is stuck.
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
