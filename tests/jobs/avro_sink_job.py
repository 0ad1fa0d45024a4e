"""A streaming job for kill -9 tests: Avro values (parse_avro) -> PostgresSink on the orders table.

Usage: avro_sink_job.py BOOTSTRAP TOPIC REGISTRY DATABASE_URL CHECKPOINT WORKDIR [available-now]
The reader schema is the topic's value subject's newest version when the job starts. Prints
"applied N" after each applied batch (100 records a batch, a task per partition).
"""

import sys
from pathlib import Path

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import Outbox, PostgresSink, parse_avro
from tests.source_support import stream

bootstrap, topic, registry, url, checkpoint, work = sys.argv[1:7]
available_now = "available-now" in sys.argv[7:]
spark = local_session(Path(work), app_name="avro-sink-job", master="local[2]")
register(spark)
raw = stream(spark, bootstrap, topic, maxOffsetsPerTrigger="100", minRecordsPerTask="1")
events = parse_avro(raw, registry, key_column="event_id")
sink = PostgresSink("orders", url=url, outbox=Outbox(topic="out", key="written.event_id::text"))
writer = sink.writer(events)


def batch(frame, batch_id):  # type: ignore[no-untyped-def]
    writer(frame, batch_id)
    print(f"applied {batch_id}", flush=True)


stream_ = events.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
query = (stream_.trigger(availableNow=True) if available_now else stream_).start()
query.awaitTermination()
print("done", flush=True)
