"""A read_committed Kafka source for Spark's Python Data Source API.

Options and output schema mirror Spark's built-in `kafka` source, so a job
switches between the two by changing the format name.
"""

from sinks.kafka_source.source import FORMAT, KafkaSource, register

__all__ = ["FORMAT", "KafkaSource", "register"]
