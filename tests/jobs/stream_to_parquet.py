"""A streaming job for kill -9 tests: kafka_rc -> parquet (Spark's exactly-once file sink).

Usage: stream_to_parquet.py BOOTSTRAP TOPIC OUT CHECKPOINT WORKDIR MAX_OFFSETS [available-now]
Prints "batch N" after each completed micro-batch.
"""

import sys
import time
from pathlib import Path

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register

bootstrap, topic, out, checkpoint, work, max_offsets = sys.argv[1:7]
available_now = sys.argv[7:] == ["available-now"]
spark = local_session(Path(work), app_name="stream-to-parquet", master="local[1]")
register(spark)
stream = (
    spark.readStream.format("kafka_rc")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", topic)
    .option("maxOffsetsPerTrigger", max_offsets)
    .load()
    .selectExpr("partition", "offset", "value")
    .writeStream.format("parquet")
    .option("path", out)
    .option("checkpointLocation", checkpoint)
)
query = stream.trigger(availableNow=True).start() if available_now else stream.start()
seen = -1
while query.isActive:
    progress = query.lastProgress
    if progress and progress["batchId"] != seen:
        seen = progress["batchId"]
        print(f"batch {seen}", flush=True)
    time.sleep(0.1)
query.awaitTermination()
print("done", flush=True)
