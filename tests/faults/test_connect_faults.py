"""kill -9 of a Spark Connect server, and of its client, in the middle of the sink's batches;
and a server too busy to start the batch function's Python process in time.

The server runs the query and its batch function; its tasks run on a Spark
standalone cluster's executors, JVMs of their own that outlive a killed server
for a moment (an orphaned task may still commit). The client only started the
query and waits. Either may die. After a restart from the same checkpoint,
every committed event is applied once, and the ledger stands at the log's end.
"""

from __future__ import annotations

import contextlib
import os
import random
import textwrap
import time
from pathlib import Path

import psycopg

from outbox.core.config import DatabaseUrl
from outbox_dev.connect import ConnectServer
from outbox_dev.spark import StandaloneCluster
from tests.helpers import REPO, Job, wait_for
from tests.sink_support import check_exactly_once, produce_orders, sink_job, table

# Two one-core executors, one on each worker; a task that failed runs again on the other.
EXECUTORS = {
    "spark.executor.memory": "768m",
    "spark.cores.max": "2",
    "spark.excludeOnFailure.taskAndStage.enabled": "true",
}


def client(server: ConnectServer, bootstrap: str, topic: str, db: DatabaseUrl, tmp: Path, run: str) -> Job:
    """The sink job as a Connect client: `sink.start` on the topic, to its end in the last run."""
    final = ["available-now"] if run == "last" else []
    return sink_job(bootstrap, topic, db, tmp, run, "start", *final, env={"SPARK_REMOTE": server.url})


def test_server_and_client_killed_mid_batch_then_restarted(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """The server killed while its tasks apply a batch on the cluster, then restarted on the same
    port; then the client killed while the restarted server applies (the query lives on in the
    server until the next client's run of it takes over); then a last run to the end of the topic."""
    with contextlib.ExitStack() as stack:
        cluster = StandaloneCluster(tmp_path / "cluster", workers=2, cores=1)
        stack.callback(cluster.stop)
        env = {"PYTHONPATH": str(REPO)}
        server = stack.enter_context(
            ConnectServer(tmp_path / "connect", master=cluster.url, conf=EXECUTORS, env=env)
        )
        expected = produce_orders(bootstrap, topic, 1500)
        first = client(server, bootstrap, topic, db, tmp_path, "first")
        first.wait_for_output("applies each batch in the Spark tasks", 180)
        wait_for(lambda: len(table(pg)) > 0, 180, "the first batch applied")
        time.sleep(random.uniform(0.0, 1.5))
        server.kill9()
        first.kill9()
        assert len(table(pg)) < len(expected), "the kill came too late to land mid-stream"

        server.start()
        expected.update(produce_orders(bootstrap, topic, 700))
        applied = len(table(pg))
        second = client(server, bootstrap, topic, db, tmp_path, "second")
        wait_for(lambda: len(table(pg)) > applied, 180, "a batch applied after the restart")
        second.kill9()

        last = client(server, bootstrap, topic, db, tmp_path, "last")
        assert last.wait(300) == 0, last.output()[-4000:]
        check_exactly_once(pg, bootstrap, topic, expected)


# Run at the start of every Python process of the server: the first batch-function process
# (Spark's foreach_batch_worker) sleeps past Spark's 10 s to connect back, as on a busy server.
LATE_WORKER = """
import os, sys, time
if "pyspark.sql.connect.streaming.worker.foreach_batch_worker" in sys.orig_argv:
    try:
        os.close(os.open(os.environ["LATE_WORKER_MARK"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        time.sleep(14)
"""


def test_a_batch_function_that_starts_late_on_the_server_is_started_again(  # type: ignore[no-untyped-def]
    bootstrap, topic, db, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """The server's Python process for the sink's batch function connects back after Spark's
    10 s: the query did not start, so `sink.start` starts it again, says so, and the job applies
    every committed event once."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(LATE_WORKER))
    mark = tmp_path / "late-once"
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "LATE_WORKER_MARK": str(mark)}
    with ConnectServer(tmp_path / "connect", env=env) as server:
        expected = produce_orders(bootstrap, topic, 600)
        job = client(server, bootstrap, topic, db, tmp_path, "last")
        assert job.wait(300) == 0, job.output()[-4000:]
    assert mark.exists(), "the late process never ran: the test injected nothing"
    said = "did not connect back within Spark's 10 s (a busy server); starting the query again in 2s (2 of 5)"
    assert said in job.output(), job.output()[-4000:]
    check_exactly_once(pg, bootstrap, topic, expected)
