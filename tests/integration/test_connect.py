"""kafka_rc and the Postgres sink from a Spark Connect client, against a real Connect server.

Each client is a job of its own (a process holds a classic session or a Connect
one, not both), pointed at the run's server by SPARK_REMOTE; what it runs
beside the server (the sink's batch function, kafka_rc's reads) runs there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from outbox.dev.connect import ConnectServer
from tests.helpers import Job, produce_transaction, read_committed, transactional_producer
from tests.sink_support import check_exactly_once, produce_orders

PROBE = "tests/jobs/connect_probe.py"
SINK_JOB = "tests/jobs/sink_job.py"


def probe(server: ConnectServer, tmp: Path, *argv: str) -> Any:
    job = Job(
        [PROBE, argv[0], str(tmp / "work"), *argv[1:]], tmp / f"{argv[0]}.log", {"SPARK_REMOTE": server.url}
    )
    assert job.wait(180) == 0, job.output()[-4000:]
    said = json.loads(job.output().strip().splitlines()[-1])
    assert said["session"].startswith("pyspark.sql.connect"), said  # a Connect client, not a classic driver
    return said["answer"]


def test_the_sink_routes_connect_frames_as_classic_ones(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """The placement decision read from the client's plan, with no JVM: the same as classic's
    (test_sink_placement_frames) for every frame of the shared list."""
    answer = probe(connect_server, tmp_path, "routes")
    assert answer["routes"] == answer["expected"]


def test_kafka_rc_reads_committed_records_only(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, topic, tmp_path: Path
) -> None:
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(b"k1", b"kept-1"), (b"k2", b"kept-2")])
    produce_transaction(producer, topic, [(b"k1", b"aborted")], commit=False)
    produce_transaction(producer, topic, [(b"k3", b"kept-3")])
    rows = probe(connect_server, tmp_path, "read", bootstrap, topic)
    wanted = sorted([p, o, k.decode(), v.decode()] for p, o, k, v in read_committed(bootstrap, topic, 2))
    assert rows == wanted and len(rows) == 3


def test_the_sink_applies_every_committed_event_once(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, topic, db, pg, tmp_path: Path
) -> None:
    """Redelivered duplicates, edits and an aborted transaction, in batches of 400, applied in the
    server's tasks; then the same checkpoint run again, and a new one: nothing changes."""
    expected = produce_orders(bootstrap, topic, 1000)
    for run, checkpoint in (("first", "one"), ("again", "one"), ("lost-checkpoint", "two")):
        argv = [SINK_JOB, bootstrap, topic, db.raw, "orders", str(tmp_path / checkpoint), str(tmp_path / run)]
        job = Job(
            [*argv, "400", "start", "available-now"],
            tmp_path / f"{run}.log",
            {"SPARK_REMOTE": connect_server.url},
        )
        assert job.wait(300) == 0, job.output()[-4000:]
        assert "applies each batch in the Spark tasks" in job.output(), job.output()[-4000:]
        check_exactly_once(pg, bootstrap, topic, expected)
        # The check that no batch was lost knows the query: its id, read from the checkpoint.
        query = json.loads((tmp_path / checkpoint / "metadata").read_text())["id"]
        assert pg.execute("SELECT query_id FROM sink_batches").fetchall() == [(query,)]
