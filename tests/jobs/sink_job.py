"""A streaming job for kill -9 tests: kafka_rc -> PostgresSink, with an optional pause.

Usage: sink_job.py BOOTSTRAP TOPIC DATABASE_URL TABLE CHECKPOINT WORKDIR MAX_OFFSETS PAUSE_AT
       [available-now] [metrics] [versioned]
PAUSE_AT is a batch id: after its rows are staged (executors committed) and before
it is applied, the job prints "staged N" and waits to be killed (-1: never).
Prints "applied N" after each applied batch. With PAUSE_AT "start" the job runs
`sink.start` as a user would (in the tasks where the frame allows it) and prints
its route, and at the end `sink.last` as JSON: what a Spark Connect client
(SPARK_REMOTE) can see, since its batch function runs beside the server.
With "metrics" it serves the sink's metrics and prints "metrics HOST:PORT SINK"; with
"versioned" the sink keeps the newest `version` of each row; with "evolve" it adds the columns
the table lacks (evolve=True) when its writer is made, before batch 0.
"""

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import Outbox, PostgresSink
from tests.sink_support import orders_stream

bootstrap, topic, url, table, checkpoint, work, max_offsets, pause_at = sys.argv[1:9]
available_now = "available-now" in sys.argv[9:]
spark = local_session(Path(work), app_name="sink-job", master="local[2]")
register(spark)
versioned = "versioned" in sys.argv[9:]
events = orders_stream(spark, bootstrap, topic, max_offsets, versioned)
outbox = Outbox(topic="out", key="written.event_id::text")
sink = PostgresSink(
    table,
    url=url,
    outbox=outbox,
    version="version" if versioned else None,
    evolve="evolve" in sys.argv[9:],
)
trigger = {"availableNow": True} if available_now else {"processingTime": "1 second"}
if "metrics" in sys.argv[9:]:
    print(f"metrics {sink.serve_metrics(spark).address} {sink.name}", flush=True)
if pause_at == "start":
    query = sink.start(events, checkpoint, trigger=trigger)
    print(f"route: {sink.route}", flush=True)
else:
    writer = sink.writer(events)

    def batch(frame, batch_id):  # type: ignore[no-untyped-def]
        staged = writer.stage(frame, batch_id)
        if batch_id == int(pause_at):
            print(f"staged {batch_id}", flush=True)
            time.sleep(3600)
        writer.apply(staged)
        print(f"applied {batch_id}", flush=True)

    stream = events.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
    query = (stream.trigger(availableNow=True) if available_now else stream).start()
query.awaitTermination()
if pause_at == "start":
    print(f"last: {json.dumps(asdict(sink.last) if sink.last else None)}", flush=True)
print("done", flush=True)
