"""The reader's loop over one range (sinks/kafka_source/reader.py), fed by a scripted consumer.

What a broker does to a read is tested on real brokers (tests/faults); here, what
the loop makes of message sequences a broker can hand it but is hard to make it
hand on cue: a reset to the earliest offset in the middle of a range.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from outbox.core.errors import ServiceUnavailable
from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import FetchPosition, _drain


class Scripted:
    """A consumer that returns these runs of offsets, one run a call, then nothing; the offsets in
    `failing` come as errors of that code."""

    def __init__(self, *runs: range, failing: dict[int, int] | None = None) -> None:
        self.runs = list(runs)
        self.at = 0
        self.failing = failing or {}

    def consume(self, count: int, timeout: float) -> list[Message]:
        if not self.runs:
            return []
        run = self.runs.pop(0)
        self.at = run[-1] + 1
        return [self.message(o) for o in run]

    def message(self, offset: int) -> Message:
        if offset in self.failing:
            return Message(topic="t", partition=0, offset=offset, error=KafkaError(self.failing[offset]))
        return Message(
            topic="t", partition=0, offset=offset, key=b"k%d" % offset, value=b"v", timestamp=(1, 7 + offset)
        )

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition("t", 0, self.at)]


def test_offsets_met_again_after_a_reset_to_the_earliest_mid_range_are_read_once() -> None:
    """With failOnDataLoss=false librdkafka resets to the earliest offset when the log was cut
    under it: the offsets of the range read before the reset came again, and were read twice."""
    rng = Range("t", 0, 100, 200)
    consumer = Scripted(range(100, 150), range(0, 200))
    batches = list(_drain(consumer, rng, 10.0, 10.0, FetchPosition(rng), True))  # type: ignore[arg-type]
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(100, 200))


def test_a_read_without_stamps_has_the_same_keys_values_and_offsets_and_null_stamps() -> None:
    rng = Range("t", 0, 0, 50)
    stamped, bare = (
        list(_drain(Scripted(range(0, 50)), rng, 10.0, 10.0, FetchPosition(rng), s))  # type: ignore[arg-type]
        for s in (True, False)
    )
    assert stamped[0].schema == bare[0].schema
    for column in ("key", "value", "topic", "partition", "offset"):
        assert bare[0].column(column) == stamped[0].column(column)
    assert stamped[0].column("timestamp").null_count == 0
    for column in ("timestamp", "timestampType", "headers"):
        assert bare[0].column(column).null_count == 50


def test_an_error_of_the_group_is_passed_over_and_any_other_fails_the_read() -> None:
    rng = Range("t", 0, 0, 10)
    group = {4: KafkaError.GROUP_AUTHORIZATION_FAILED}
    read = list(_drain(Scripted(range(0, 10), failing=group), rng, 10.0, 10.0, FetchPosition(rng), False))  # type: ignore[arg-type]
    assert [o for b in read for o in b.column("offset").to_pylist()] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    failing = {**group, 6: KafkaError._TRANSPORT}
    with pytest.raises(
        ServiceUnavailable, match=r"KAFKA_RC_READ_FAILED\] t-0: Local: Broker transport failure"
    ):
        list(_drain(Scripted(range(0, 10), failing=failing), rng, 10.0, 10.0, FetchPosition(rng), False))  # type: ignore[arg-type]
