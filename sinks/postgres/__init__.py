"""An exactly-once PostgreSQL sink for Spark Structured Streaming.

Rows are staged by the executors with COPY, then applied by the driver in one
set-based transaction that also advances the offset ledger: a replayed batch,
a redelivered event or a lost checkpoint changes nothing.
"""

from sinks.postgres.apply import BatchResult, SinkError
from sinks.postgres.parse import parse_json
from sinks.postgres.sink import PostgresSink
from sinks.postgres.spec import Outbox, SinkSpec

__all__ = ["BatchResult", "Outbox", "PostgresSink", "SinkError", "SinkSpec", "parse_json"]
