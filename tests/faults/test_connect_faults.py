"""kill -9 of a Spark Connect server, and of its client, in the middle of the sink's batches.

The server runs the query and its batch function; its tasks run on a Spark
standalone cluster's executors, JVMs of their own that outlive a killed server
for a moment (an orphaned task may still commit). The client only started the
query and waits. Either may die. After a restart from the same checkpoint,
every committed event is applied once, and the ledger stands at the log's end.
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import psycopg

from outbox._core.config import DatabaseUrl
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
