"""The reader's loop over one range (sinks/kafka_source/reader.py), fed by a scripted consumer.

What a broker does to a read is tested on real brokers (tests/faults); here, what
the loop makes of message sequences a broker can hand it but is hard to make it
hand on cue: a reset to the earliest offset in the middle of a range.
"""

from __future__ import annotations

from confluent_kafka import Message, TopicPartition

from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import FetchPosition, _drain


class Scripted:
    """A consumer that returns these runs of offsets, one run a call, then nothing."""

    def __init__(self, *runs: range) -> None:
        self.runs = list(runs)
        self.at = 0

    def consume(self, count: int, timeout: float) -> list[Message]:
        if not self.runs:
            return []
        run = self.runs.pop(0)
        self.at = run[-1] + 1
        return [Message(topic="t", partition=0, offset=o, value=b"v", timestamp=(1, 0)) for o in run]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition("t", 0, self.at)]


def test_offsets_met_again_after_a_reset_to_the_earliest_mid_range_are_read_once() -> None:
    """With failOnDataLoss=false librdkafka resets to the earliest offset when the log was cut
    under it: the offsets of the range read before the reset came again, and were read twice."""
    rng = Range("t", 0, 100, 200)
    consumer = Scripted(range(100, 150), range(0, 200))
    batches = list(_drain(consumer, rng, 10.0, 10.0, FetchPosition(rng)))  # type: ignore[arg-type]
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(100, 200))
