"""A read_committed Kafka source for Spark's Python Data Source API.

Options and output schema mirror Spark's built-in `kafka` source, so a job
switches between the two by changing the format name. As in Spark's own
Kafka source: a pure range calculator, an I/O reader, and the protocol glue.

  options.py  the options, parsed and checked once on the driver
  ranges.py   which offsets each micro-batch reads, where a query starts (pure)
  cluster.py  the driver's questions to the cluster: partitions, offsets
  reader.py   an executor reading one range into Arrow batches
  source.py   Spark's DataSource / reader protocol, tying them together
"""

from sinks.kafka_source.source import FORMAT, KafkaSource, register

__all__ = ["FORMAT", "KafkaSource", "register"]
