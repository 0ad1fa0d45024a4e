"""The demo's Spark job, run as a child process the conductor kills -9 and starts again.

kafka_rc (read_committed) -> square each event's number -> PostgresSink keyed
on the account with `version="seq"`, and an outbox event for every row it
changes, in the same transaction; tracing on, so that `outbox trace` can
follow any record. Keyed on the account, the sink applies an
account's events of one batch one by one in offset order, so its outbox events
keep the account's order; `version` makes a redelivered or older event a no-op.
Prints "started" once the query runs and
"applied BATCH ROWS" once it sees a batch applied (`sink.last`, which a Spark
Connect client reads from PostgreSQL). With SPARK_REMOTE set the job is a
Spark Connect client of that server (`make demo CONNECT=1`).

With REGISTRY, the input's values are Avro under that schema registry, read with
parse_avro (`make demo FORMAT=avro`).

Usage: python -m demos.loop.transform BOOTSTRAP INPUT OUTPUT SCHEMA TABLE CHECKPOINT WORKDIR [REGISTRY]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark.sql import functions as F

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import Outbox, PostgresSink, parse_avro, parse_json

SCHEMA = "event_id string, account long, seq long, n long"
BORN = time.monotonic()  # the times printed count from here


def main(
    bootstrap: str,
    source: str,
    output: str,
    schema: str,
    table: str,
    checkpoint: str,
    work: str,
    registry: str | None = None,
) -> None:
    spark = local_session(Path(work), app_name="demo-transform", conf={"spark.sql.shuffle.partitions": "2"})
    register(spark)
    print(f"session {time.monotonic() - BORN:.1f}s", flush=True)
    raw = (
        spark.readStream.format("kafka_rc")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 5000)
        .load()
    )
    events = parse_avro(raw, registry) if registry else parse_json(raw, SCHEMA)
    squares = events.withColumn("square", F.col("n") * F.col("n"))
    sink = PostgresSink(
        table,
        schema=schema,
        key="account",
        version="seq",
        ledger_schema=schema,
        outbox=Outbox(topic=output, key="written.account::text"),
        trace=True,  # for `outbox trace` at the end of the demo
    )
    query = sink.start(squares, checkpoint)
    print(f"started {time.monotonic() - BORN:.1f}s", flush=True)
    before = sink.last  # the last batch of an earlier run of this query: not this run's work
    seen = before.batch_id if before else None
    while not query.awaitTermination(0.5):  # raises if the query failed
        last = sink.last  # on Spark Connect, read from PostgreSQL: the batches run beside the server
        if last is not None and last.batch_id != seen:
            seen = last.batch_id
            print(
                f"applied {last.batch_id} {last.upserted} at {time.monotonic() - BORN:.1f}s:"
                f" stage {last.stage_seconds:.1f}s apply {last.apply_seconds:.1f}s",
                flush=True,
            )


if __name__ == "__main__":
    main(*sys.argv[1:9])
