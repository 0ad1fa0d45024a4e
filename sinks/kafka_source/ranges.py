"""The range calculator, plain functions: which offsets each micro-batch reads, where a query starts.

Offsets are `{"topic": {"partition": next_offset}}`, the JSON shape Spark's own
Kafka source checkpoints, with string keys as Spark's Python sources require.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from core.errors import ConfigError
from sinks.kafka_source.options import EARLIEST, LATEST

Offsets = dict[str, dict[str, int]]
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int


def to_offsets(positions: Mapping[TopicPartitionKey, int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_offsets(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def resolve(
    spec: str | Offsets,
    partitions: Iterable[TopicPartitionKey],
    earliest: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    *,
    option: str,
) -> dict[TopicPartitionKey, int]:
    """Turn earliest / latest / per-partition JSON into concrete offsets."""
    partitions = list(partitions)
    if spec == "earliest":
        return {tp: earliest[tp] for tp in partitions}
    if spec == "latest":
        return {tp: latest[tp] for tp in partitions}
    assert isinstance(spec, dict)
    given = from_offsets(spec)
    missing = sorted(set(partitions) - set(given))
    if missing:
        names = ", ".join(f"{t}-{p}" for t, p in missing)
        raise ConfigError(f"option {option} gives no offset for {names}: list every partition")
    resolved = {}
    for tp in partitions:
        offset = given[tp]
        resolved[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return resolved


def cap(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    max_offsets: int | None,
) -> dict[TopicPartitionKey, int]:
    """End offsets no further than latest, at most max_offsets in all, shared by backlog."""
    available = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(available.values())
    if max_offsets is None or total <= max_offsets:
        return {tp: start[tp] + available[tp] for tp in latest}
    shares = {tp: max_offsets * size / total for tp, size in available.items()}
    take = {tp: int(share) for tp, share in shares.items()}
    # Hand out what rounding down left, largest remainders first.
    left = max_offsets - sum(take.values())
    for tp in sorted(shares, key=lambda tp: (take[tp] - shares[tp], tp))[:left]:
        take[tp] += 1
    return {tp: start[tp] + take[tp] for tp in latest}


def ranges(start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]) -> list[Range]:
    """Non-empty ranges, one per topic-partition (a partition absent from start begins at its end)."""
    out = []
    for (topic, partition), stop in sorted(end.items()):
        begin = start.get((topic, partition), stop)
        if stop > begin:
            out.append(Range(topic, partition, begin, stop))
    return out


def overlay(
    start: Mapping[TopicPartitionKey, int],
    recorded: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
) -> dict[TopicPartitionKey, int]:
    """Start where the sink's ledger says, where it says anything; check it is plausible."""
    out = dict(start)
    for tp, offset in recorded.items():
        if tp not in latest:
            continue  # a topic no longer subscribed
        if offset > latest[tp]:
            raise ConfigError(
                f"the ledger says offsets of {tp[0]}-{tp[1]} up to {offset} were applied, but the"
                f" partition ends at {latest[tp]}: was the topic recreated? (fix or delete the ledger rows)"
            )
        out[tp] = offset
    return out


def split(rngs: list[Range], min_partitions: int | None) -> list[Range]:
    """Cut ranges into at least min_partitions pieces, sized by backlog (Spark's minPartitions)."""
    if not min_partitions or len(rngs) >= min_partitions:
        return rngs
    total = sum(r.end - r.start for r in rngs)
    out = []
    for r in rngs:
        size = r.end - r.start
        parts = max(1, min(size, round(size / total * min_partitions)))
        bounds = [r.start + size * i // parts for i in range(parts + 1)]
        out += [Range(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds) if b > a]
    return out
