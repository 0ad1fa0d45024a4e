"""The sink half of the cluster tests' loop: every topic matching a pattern -> PostgresSink.

Usage: loop_sink_job.py BOOTSTRAP PATTERN DATABASE_URL TABLE OUTBOX_TOPIC CHECKPOINT WORKDIR
Reads the relay's output topics with kafka_rc (read_committed), keyed on the
event id in each payload, into TABLE; every row it writes also writes an outbox
event to OUTBOX_TOPIC, so an event applied twice would show twice.
Prints "started" once the query runs. POLL_TIMEOUT_MS: kafka_rc's pollTimeoutMs; APPLY_IN: the
sink's apply_in.
"""

import os
import sys
from pathlib import Path

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import Outbox, PostgresSink, parse_json

bootstrap, pattern, url, table, out, checkpoint, work = sys.argv[1:8]
spark = local_session(Path(work), app_name="loop-sink", conf={"spark.sql.shuffle.partitions": "2"})
register(spark)
raw = (
    spark.readStream.format("kafka_rc")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribePattern", pattern)
    .option("pollTimeoutMs", os.environ.get("POLL_TIMEOUT_MS", "120000"))
    .load()
)
events = parse_json(raw, "event_id string, n int", key_column="event_id")
outbox = Outbox(topic=out, key="written.event_id::text")
sink = PostgresSink(table, url=url, outbox=outbox, apply_in=os.environ.get("APPLY_IN", "auto"))  # type: ignore[arg-type]
query = sink.start(events, checkpoint, trigger={"processingTime": "1 second"})
print("started", flush=True)
query.awaitTermination()
