"""Questions a Spark Connect client asks, answered as one JSON line (SPARK_REMOTE names the server).

Usage: connect_probe.py routes WORKDIR
       connect_probe.py read WORKDIR BOOTSTRAP TOPIC
       connect_probe.py mistakes WORKDIR BOOTSTRAP
       connect_probe.py avro WORKDIR BOOTSTRAP TOPIC REGISTRY DATABASE_URL TABLE
routes: the sink's route for each of tests.placement_frames, and the expected one.
read: kafka_rc's batch read of TOPIC, as [partition, offset, key, value] rows.
mistakes: what a client is told of kafka_rc options that are wrong, one message each.
avro: TOPIC's Avro values (the subject TOPIC-value at REGISTRY) through parse_avro into TABLE, once
(availableNow); the sink's route.
"""

import json
import sys
from pathlib import Path

from outbox_dev.local_spark import local_session, stop_session
from sinks.kafka_source import register
from sinks.postgres import PostgresSink, parse_avro
from tests.placement_frames import expected, routes
from tests.source_support import batch_read, mistakes, stream

command, work = sys.argv[1:3]
spark = local_session(Path(work), app_name="connect-probe")
register(spark)
if command == "routes":
    answer: object = {"routes": routes(spark), "expected": expected(spark)}
elif command == "mistakes":
    answer = mistakes(spark, sys.argv[3])
elif command == "avro":
    bootstrap, topic, registry, url, table = sys.argv[3:8]
    frame = parse_avro(stream(spark, bootstrap, topic), registry, key_column="event_id")
    sink = PostgresSink(table, url=url)
    sink.start(frame, str(Path(work) / "checkpoint"), trigger={"availableNow": True}).awaitTermination()
    answer = str(sink.route)
else:
    bootstrap, topic = sys.argv[3:5]
    rows = batch_read(spark, bootstrap, topic)
    answer = sorted([r.partition, r.offset, r.key.decode(), r.value.decode()] for r in rows)
print(json.dumps({"session": type(spark).__module__, "answer": answer}), flush=True)
stop_session(spark)
