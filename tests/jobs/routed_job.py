"""A streaming job for routing's kill -9 tests: kafka_rc -> PostgresSink.routed into three tables.

Usage: routed_job.py BOOTSTRAP TOPIC DATABASE_URL CHECKPOINT WORKDIR MODE [available-now]
MODE tasks: each batch applied in the tasks, as sink.start does it.
MODE driver-N: each batch staged by the tasks and applied on the driver; after batch N's rows are
staged the job prints "staged N" and waits to be killed.
Prints "applied N" after each batch (the route first: "route: ..."). 300 records a batch, a task
per partition. SPARK_REMOTE: run as a Spark Connect client (MODE tasks only).
"""

import sys
import time
from pathlib import Path

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import parse_json
from tests.routing_support import SCHEMA, routed_sink
from tests.source_support import stream

bootstrap, topic, url, checkpoint, work, mode = sys.argv[1:7]
available_now = sys.argv[7:] == ["available-now"]
spark = local_session(Path(work), app_name="routed-job", master="local[2]")
register(spark)
raw = stream(spark, bootstrap, topic, maxOffsetsPerTrigger="300", minRecordsPerTask="1")
events = parse_json(raw, SCHEMA)
driver = mode.startswith("driver-")
sink = routed_sink(url, outboxed=True, apply_in="driver" if driver else "tasks")
writer = sink.writer(events, checkpoint)
print(f"route: {writer.route}", flush=True)


def batch(frame, batch_id):  # type: ignore[no-untyped-def]
    if not driver:
        writer(frame, batch_id)
    else:
        staged = writer.stage(frame, batch_id)
        if batch_id == int(mode.removeprefix("driver-")):
            print(f"staged {batch_id}", flush=True)
            time.sleep(3600)
        writer.apply(staged)
    print(f"applied {batch_id}: {writer.last}", flush=True)


stream_ = events.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
query = (stream_.trigger(availableNow=True) if available_now else stream_).start()
query.awaitTermination()
print("done", flush=True)
