"""Spark sinks into PostgreSQL that apply each Kafka event exactly once.

kafka_source/   kafka_rc: a read_committed Kafka source in Python
postgres/       PostgresSink: idempotent upserts with the Kafka offsets in the same transaction
ledger.py       the sink's offset ledger, read back by the source when a checkpoint is lost
errors.py       the source's and the sink's errors: each one's code, class and message; SinkError

A local SparkSession with the framework's settings and jars is in the dev
tools (outbox_dev.local_spark).
"""

import importlib.util

if importlib.util.find_spec("pyspark") is None:  # the base install: the outbox half alone
    from sinks.errors import error

    raise error("SINK_SPARK_MISSING")
