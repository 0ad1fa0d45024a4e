"""A streaming job for fault tests of the sink's executors: kafka_rc -> PostgresSink.

Usage: sink_tasks_job.py BOOTSTRAP TOPIC DATABASE_URL CHECKPOINT WORKDIR MAX_OFFSETS MODE [available-now]
MODE plain: each batch applied in the tasks as the sink does it.
MODE fail-after-commit: every task fails once after its transaction committed (the task's
first attempt), and Spark runs it again (master local[2,2]: two attempts per task).
MODE pause-after-commit: batch 0's task of partition 1, once committed, writes its pid to
WORKDIR/paused and sleeps, for the test to kill -9 its executor.
MODE driver: each batch staged by the tasks and applied on the driver (apply_in='driver').
Prints "application ID" first, and "applied N: fresh F of S rows, R retries" after each batch.
SPARK_MASTER: a standalone cluster's URL to run on instead of local[2,2]; a task that fails there
is retried on another executor (spark.excludeOnFailure.taskAndStage.enabled).
DATABASE_TIMEOUT: the sink's database_timeout, in seconds.
SPARK_SPECULATION: set, Spark runs speculative copies of slow tasks (eagerly).
EXECUTOR_PGPORT: the port the executors' Python workers reach PostgreSQL at, given a DATABASE_URL
without one (libpq's PGPORT); the driver takes PGPORT from its own environment.
"""

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from outbox_dev.local_spark import local_session
from sinks.kafka_source import register
from sinks.postgres import Outbox, PostgresSink
from sinks.postgres.task import TASK_RESULT
from tests.sink_support import orders_stream

bootstrap, topic, url, checkpoint, work, max_offsets, mode = sys.argv[1:8]
available_now = sys.argv[8:] == ["available-now"]
master = os.environ.get("SPARK_MASTER", "local[2,2]")
conf = (
    {
        "spark.executor.memory": "768m",
        "spark.cores.max": "2",
        "spark.excludeOnFailure.taskAndStage.enabled": "true",
    }
    if master.startswith("spark:")
    else {}
)
if os.environ.get("SPARK_SPECULATION"):  # a task slower than half its stage's gets a second attempt
    conf |= {
        "spark.speculation": "true",
        "spark.speculation.interval": "100ms",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "1.2",
        "spark.speculation.minTaskRuntime": "100ms",
    }
if "EXECUTOR_PGPORT" in os.environ:
    conf["spark.executorEnv.PGPORT"] = os.environ["EXECUTOR_PGPORT"]
spark = local_session(Path(work), app_name="sink-tasks-job", master=master, conf=conf)
register(spark)
print(f"application {spark.sparkContext.applicationId}", flush=True)
events = orders_stream(spark, bootstrap, topic, max_offsets)
timeout = float(os.environ.get("DATABASE_TIMEOUT", "30"))
outbox = Outbox(topic="out", key="written.event_id::text")
apply_in = "driver" if mode == "driver" else "auto"
sink = PostgresSink("orders", url=url, outbox=outbox, database_timeout=timeout, apply_in=apply_in)
writer = sink.writer(events)
assert writer.route.tasks == (mode != "driver"), writer.route


def fail_first_attempt(results: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    done = list(results)  # the task's transaction has committed
    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        raise RuntimeError("injected: the task fails after its commit")
    yield from done


def pause_first_attempt(results: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    done = list(results)  # the task's transaction has committed
    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0 and context.partitionId() == 1:
        paused = Path(work) / "paused"
        paused.with_suffix(".part").write_text(str(os.getpid()))
        paused.with_suffix(".part").rename(paused)
        time.sleep(3600)
    yield from done


AFTER_COMMIT = {"fail-after-commit": fail_first_attempt, "pause-after-commit": pause_first_attempt}


def batch(frame, batch_id):  # type: ignore[no-untyped-def]
    then = AFTER_COMMIT.get(mode) if batch_id == 0 or mode == "fail-after-commit" else None
    if then:  # the writer's own path (its checks, its record of the batch), each task's result late
        writer._run_tasks = lambda b, after: writer.tasks(b, after).mapInArrow(then, TASK_RESULT).collect()
    else:
        writer.__dict__.pop("_run_tasks", None)
    writer(frame, batch_id)  # as a query runs it: started over where PostgreSQL says to
    result = writer.last
    line = f"applied {batch_id}: fresh {result.fresh} of {result.staged} rows, {result.retries} retries"
    print(line, flush=True)


stream = events.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
query = (stream.trigger(availableNow=True) if available_now else stream).start()
query.awaitTermination()
print("done", flush=True)
