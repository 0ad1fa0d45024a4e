"""An exactly-once PostgreSQL sink for Spark Structured Streaming.

Each Spark task applies its topic-partitions' rows in one transaction that also
moves their offset ledger, when the frame's plan proves a topic-partition stays
in one task; otherwise the executors stage the rows with COPY and the driver
applies the batch in one transaction. Either way a replayed batch, a retried
task, a redelivered event or a lost checkpoint changes nothing.

  sink.py       PostgresSink, the public entry: the settings, and the query it starts
  writer.py     BatchWriter: start-time checks, then each batch on one of two paths
  in_tasks.py   applied in the tasks, which read Kafka themselves where they can
  on_driver.py  staged by the executors, then applied on the driver
  session.py    what both paths share: the driver's connection and the sink's lock
  lanes.py      each table made, evolved and planned at start; columns.py: the Spark columns
  placement.py  in the tasks or on the driver, proven from the frame's plan
  task.py       a task's own transaction (executor side)
  stage.py      the executors' COPY into the stage table (driver path)
  apply.py      a set of staged rows applied with the ledger, one transaction
  statements.py the SQL that applies a batch, built with psycopg.sql
  bookkeeping.py  the SQL of the stage table, the batch record and the ledger
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
