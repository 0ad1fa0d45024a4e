"""How many rows a batch may take: fewer after one that ran out of time, more again once they go fast.

A batch must reach Kafka within its window (`Publisher.window`: past
`transaction.timeout.ms` the coordinator aborts the transaction and the client
times its records out; the commit is asked for twice `--kafka-timeout`). On a
link too slow for a whole batch (a throttled link, a producer quota) the same
batch sent again fails the same way, for ever. So a batch that
failed after using up half its window makes the next ones half its size, and a
full batch that took under a quarter of the window lets the next ones be twice
as large, up to `--batch-size`. A failure early in the window (a link cut, a
broker refusing at once) changes nothing; an outage that fails a batch late
in it halves them too (exactly once, a commit to brokers that are down is
asked for again for half the window), and the first fast full batches after
it double them back.
"""

from __future__ import annotations


def after_failure(limit: int, sent: int, elapsed: float, window: float) -> int:
    """The limit after a batch of `sent` rows failed `elapsed` seconds into its `window`: half what
    it sent, also where that was less than the limit (cut by the byte budget, or by the end of its
    delta: read again, it is cut the same way; only a batch of over half the limit counted before
    2026-11-28, and large rows failed for ever)."""
    if elapsed < window / 2:
        return limit
    return max(1, min(limit, sent) // 2)


def after_success(limit: int, most: int, sent: int, elapsed: float, window: float) -> int:
    """The limit after a batch of `sent` rows reached Kafka in `elapsed` seconds of its `window`."""
    if sent < limit or elapsed >= window / 4:
        return limit
    return min(most, limit * 2)
