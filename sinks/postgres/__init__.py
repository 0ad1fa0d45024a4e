"""An exactly-once PostgreSQL sink for Spark Structured Streaming.

Each Spark task applies its topic-partitions' rows in one transaction that also
moves their offset ledger, when the frame's plan proves a topic-partition stays
in one task; otherwise the executors stage the rows with COPY and the driver
applies the batch in one transaction. Either way a replayed batch, a retried
task, a redelivered event or a lost checkpoint changes nothing.

  sink.py       PostgresSink and BatchWriter: start-time checks, then each batch
  placement.py  in the tasks or on the driver, proven from the frame's plan
  task.py       a task's own transaction (executor side)
  stage.py      the executors' COPY into the stage table (driver path)
  apply.py      a set of staged rows applied with the ledger, one transaction
  statements.py the SQL, built with psycopg.sql
  plan.py       which columns go where, checked at start; catalog.py reads the table
  spec.py       what the user asked for; parse.py: parse_json, parse_avro, parse_protobuf
  routing.py    one query into several tables: Table, header, each row's lane
  decoded.py    registry-framed values decoded in the tasks: avro.py, protobuf.py
"""

from sinks.errors import SinkError
from sinks.postgres.apply import BatchResult
from sinks.postgres.parse import parse_avro, parse_json, parse_protobuf
from sinks.postgres.routing import Table, header
from sinks.postgres.settings import Outbox
from sinks.postgres.sink import PostgresSink
from sinks.postgres.spec import SinkSpec

__all__ = [
    "BatchResult",
    "Outbox",
    "PostgresSink",
    "SinkError",
    "SinkSpec",
    "Table",
    "header",
    "parse_avro",
    "parse_json",
    "parse_protobuf",
]
