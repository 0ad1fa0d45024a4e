"""The range calculator, plain functions: which offsets each micro-batch reads, where a query starts.

Offsets are `{"topic": {"partition": next_offset}}`, the JSON shape Spark's own
Kafka source checkpoints, with string keys as Spark's Python sources require.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from outbox.core.errors import OutboxError
from sinks.errors import error
from sinks.kafka_source.options import EARLIEST, LATEST

Offsets = dict[str, dict[str, int]]
TopicPartitionKey = tuple[str, int]
TopicIds = dict[str, str]  # Kafka's topic id per topic name
IDS = "#topicIds"  # the offsets' entry for the topics' ids ('#' is not allowed in a topic's name)


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one topic-partition, read by one task: small ones share a task
    (`pack`), and minPartitions cuts large ones (`split`)."""

    topic: str
    partition: int
    start: int
    end: int


def to_offsets(positions: Mapping[TopicPartitionKey, int], ids: Mapping[str, str] | None = None) -> Offsets:
    """Positions, and the ids of their topics: a topic recreated under its name has another id."""
    out: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    if ids:
        out[IDS] = {t: ids[t] for t in sorted(out) if t in ids}  # type: ignore[misc]  # Offsets' ids entry maps topic to id, not partition to offset
    return out


def from_offsets(offsets: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() if t != IDS for p, o in parts.items()}


def topic_ids(offsets: Mapping[str, Mapping[str, object]]) -> TopicIds:
    """The topic ids recorded with `offsets` (none in checkpoints written before they were)."""
    return {t: str(i) for t, i in offsets.get(IDS, {}).items()}


def reconcile(
    begin: Mapping[TopicPartitionKey, int],
    known: Mapping[str, str],
    ids: Mapping[str, str],
    earliest: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
) -> tuple[dict[TopicPartitionKey, int], list[OutboxError]]:
    """Where each partition can begin now, and what was lost on the way (Spark's failOnDataLoss cases),
    each as the DataLossError that stops the query.

    known: the topic ids `begin` was read under; ids: the topics' ids now. A
    topic recreated under its name, and a log that now starts after `begin`
    (retention deleted records never read), begin again at the earliest offset;
    a log that now ends before `begin` (truncated: Kafka keeps its prefix, which
    was read) at its end, as Spark's source does, where the topic's id shows it
    is the topic read, and otherwise at the earliest: read again, not lost.
    Each is a loss.
    """
    recreated = sorted({t for t, _ in begin if t in known and t in ids and known[t] != ids[t]})
    losses = [error("KAFKA_RC_TOPIC_RECREATED", topic=t, was=known[t], now=ids[t]) for t in recreated]
    out = {tp: earliest[tp] for tp in earliest if tp[0] in recreated}
    for tp, offset in sorted(begin.items()):
        topic, partition = tp
        if topic in recreated:
            continue
        if tp in latest and offset > latest[tp]:
            losses.append(
                error(
                    "KAFKA_RC_LOG_TRUNCATED", topic=topic, partition=partition, end=latest[tp], offset=offset
                )
            )
            offset = latest[tp] if topic in known and known[topic] == ids.get(topic) else earliest[tp]
        elif tp in earliest and offset < earliest[tp]:
            losses.append(
                error(
                    "KAFKA_RC_OFFSETS_DELETED",
                    first=offset,
                    last=earliest[tp] - 1,
                    topic=topic,
                    partition=partition,
                )
            )
            offset = earliest[tp]
        out[tp] = offset
    return out, losses


def added(
    begin: Mapping[TopicPartitionKey, int],
    earliest: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
) -> tuple[dict[TopicPartitionKey, int], list[OutboxError]]:
    """Where the partitions added since `begin` start (their earliest offset), and the loss of
    each whose log no longer starts at 0: retention deleted records no batch read (Spark's rule)."""
    new = {tp: earliest[tp] for tp in latest if tp not in begin and tp in earliest}
    losses = [
        error("KAFKA_RC_OFFSETS_DELETED", first=0, last=start - 1, topic=t, partition=p)
        for (t, p), start in sorted(new.items())
        if start > 0
    ]
    return new, losses


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
        raise error("KAFKA_RC_OFFSETS_INCOMPLETE", option=option, partitions=names)
    resolved = {}
    for tp in partitions:
        offset = given[tp]
        resolved[tp] = earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
    return resolved


def check_ends(start: Mapping[TopicPartitionKey, int], ending: str | Offsets) -> None:
    """An offset endingOffsets names before the batch query's start is refused, as Spark's is, not
    read as nothing. (`latest`, the last stable offset, may rightly lie before a start given inside
    a transaction still open: that reads nothing yet.)"""
    end = from_offsets(ending) if isinstance(ending, dict) else {}
    behind = sorted(tp for tp, offset in end.items() if tp in start and 0 <= offset < start[tp])
    if behind:
        names = ", ".join(f"{t}-{p} ({start[(t, p)]} > {end[(t, p)]})" for t, p in behind)
        raise error("KAFKA_RC_OFFSETS_END_BEFORE_START", partitions=names)


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


def hold(
    begin: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """`end`, and every partition of `begin` it does not name (no leader to ask for its offsets)
    where it is: left out of a batch's end, a partition would start again at its earliest offset."""
    return {**begin, **end}


def ranges(start: Mapping[TopicPartitionKey, int], end: Mapping[TopicPartitionKey, int]) -> list[Range]:
    """Non-empty ranges, one per topic-partition (a partition absent from start begins at its end)."""
    out = []
    for (topic, partition), stop in sorted(end.items()):
        begin = start.get((topic, partition), stop)
        if stop > begin:
            out.append(Range(topic, partition, begin, stop))
    return out


def overlay(
    start: Mapping[TopicPartitionKey, int], recorded: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Start where the sink's ledger says, where it says anything of a partition read now."""
    return {tp: recorded.get(tp, offset) for tp, offset in start.items()}


def pack(rngs: list[Range], records: int) -> list[tuple[Range, ...]]:
    """Whole ranges into tasks of about `records` records: a range that holds that many alone, the
    smaller ones together. Spark charges each task far more than a small range costs to
    read (bench/scale.py: 2.8 s for 48 empty Python tasks on 2 cores), and a task that holds whole
    topic-partitions still holds all of each (the sink applies them in that task)."""
    tasks: list[tuple[Range, ...]] = []
    held: list[Range] = []
    holding = 0  # offsets in `held`
    for r in rngs:
        if r.end - r.start >= records:
            tasks.append((r,))
            continue
        held.append(r)
        holding += r.end - r.start
        if holding >= records:
            tasks.append(tuple(held))
            held, holding = [], 0
    return [*tasks, tuple(held)] if held else tasks


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
