"""kafka_rc and the Postgres sink from a Spark Connect client, against a real Connect server.

Each client is a job of its own (a process holds a classic session or a Connect
one, not both), pointed at the run's server by SPARK_REMOTE; what it runs
beside the server (the sink's batch function, kafka_rc's reads) runs there.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from outbox_dev.connect import ConnectServer
from outbox_dev.process import cmdline_contains, free_port, port_in_use
from tests.helpers import (
    Job,
    create_topic,
    produce_transaction,
    read_committed,
    transactional_producer,
    unique,
)
from tests.routing_support import TABLES, check_routed, produce_shop
from tests.sink_support import check_exactly_once, produce_orders, produce_poison
from tests.source_support import mistakes

PROBE = "tests/jobs/connect_probe.py"
SINK_JOB = "tests/jobs/sink_job.py"
ROUTED_JOB = "tests/jobs/routed_job.py"


def probe(url: str, tmp: Path, question: str, *args: str) -> Any:
    """Ask tests/jobs/connect_probe.py, as a client of the server at `url`."""
    job = Job([PROBE, question, str(tmp / "work"), *args], tmp / f"{question}.log", {"SPARK_REMOTE": url})
    assert job.wait(180) == 0, job.output()[-4000:]
    said = json.loads(job.output().strip().splitlines()[-1])
    assert said["session"].startswith("pyspark.sql.connect"), said  # a Connect client, not a classic driver
    return said["answer"]


def test_the_sink_routes_connect_frames_as_classic_ones(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    """The placement decision read from the client's plan, with no JVM: the same as classic's
    (test_sink_placement_frames) for every frame of the shared list."""
    answer = probe(connect_server.url, tmp_path, "routes")
    assert answer["routes"] == answer["expected"]


def test_kafka_rc_reads_committed_records_only(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, topic, tmp_path: Path
) -> None:
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [(b"k1", b"kept-1"), (b"k2", b"kept-2")])
    produce_transaction(producer, topic, [(b"k1", b"aborted")], commit=False)
    produce_transaction(producer, topic, [(b"k3", b"kept-3")])
    rows = probe(connect_server.url, tmp_path, "read", bootstrap, topic)
    wanted = sorted([p, o, k.decode(), v.decode()] for p, o, k, v in read_committed(bootstrap, topic, 2))
    assert rows == wanted and len(rows) == 3


def test_kafka_rc_tells_a_connect_client_what_it_tells_a_classic_one(  # type: ignore[no-untyped-def]
    spark, connect_server: ConnectServer, bootstrap, tmp_path: Path
) -> None:
    """Wrong options get the same one line in both modes (the server's Python raised it)."""
    told = probe(connect_server.url, tmp_path, "mistakes", bootstrap)
    assert told == mistakes(spark, bootstrap)
    assert all(told.values()), told
    assert (
        told["no bootstrap"] == "[KAFKA_RC_BOOTSTRAP_MISSING] option kafka.bootstrap.servers is required"
    ), told


def test_the_sink_applies_every_committed_event_once(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, topic, db, pg, tmp_path: Path
) -> None:
    """Redelivered duplicates, edits, an aborted transaction, poison records and tombstones, in
    batches of 400, applied in the server's tasks; then the same checkpoint run again, and a new
    one: nothing changes. The client reads what the last batch did (`sink.last`) though the
    batches ran beside the server."""
    expected = produce_orders(bootstrap, topic, 1000)
    dead = produce_poison(bootstrap, topic)
    gone = list(expected)[-5:]  # not among the edited ones, the first tenth
    produce_transaction(transactional_producer(bootstrap), topic, [(i.encode(), None) for i in gone])
    for i in gone:
        del expected[i]
    first: dict[str, Any] | None = None
    for run, checkpoint in (("first", "one"), ("again", "one"), ("lost-checkpoint", "two")):
        argv = [SINK_JOB, bootstrap, topic, db.raw, "orders", str(tmp_path / checkpoint), str(tmp_path / run)]
        job = Job(
            [*argv, "400", "start", "available-now"],
            tmp_path / f"{run}.log",
            {"SPARK_REMOTE": connect_server.url},
        )
        assert job.wait(300) == 0, job.output()[-4000:]
        assert "applies each batch in the Spark tasks" in job.output(), job.output()[-4000:]
        check_exactly_once(pg, bootstrap, topic, expected, dead=dead, deleted=len(gone))
        # The check that no batch was lost knows the query: its id, read from the checkpoint.
        query = json.loads((tmp_path / checkpoint / "metadata").read_text())["id"]
        recorded = dict(pg.execute("SELECT query_id, batch_id FROM sink_batches").fetchall())
        assert query in recorded, recorded
        last = json.loads(job.output().split("last: ", 1)[1].splitlines()[0])
        assert last["batch_id"] == recorded[query] and last["staged"] > 0, last
        if run == "first":  # its last batch brought new events
            assert last["fresh"] > 0, last
        elif run == "again":  # no batch: the query's last one is still the first run's
            assert last == first, (last, first)
        else:  # a new query over events all applied
            assert last["fresh"] == last["upserted"] == last["deleted"] == last["dead"] == 0, last
        first = first or last


def test_a_routed_sink_applies_three_types_to_three_tables_from_a_connect_client(  # type: ignore[no-untyped-def]
    connect_server: ConnectServer, bootstrap, outbox_db, pg, tmp_path: Path
) -> None:
    """PostgresSink.routed's writer, pickled to the server with its lanes, applies in the server's
    tasks: each table the fold of its type, one ledger, `outbox verify` content."""
    pg.execute(TABLES)
    topic = create_topic(bootstrap, unique("shop"), partitions=2)
    strays = produce_shop(bootstrap, topic, 60)
    argv = [ROUTED_JOB, bootstrap, topic, outbox_db.raw, str(tmp_path / "checkpoint"), str(tmp_path / "w")]
    job = Job(
        [*argv, "tasks", "available-now"], tmp_path / "routed.log", {"SPARK_REMOTE": connect_server.url}
    )
    assert job.wait(300) == 0, job.output()[-4000:]
    assert "applies each batch in the Spark tasks" in job.output(), job.output()[-4000:]
    check_routed(pg, bootstrap, topic, outbox_db.raw, strays)


def test_outbox_dev_connect_serves_until_stopped(bootstrap, topic, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`outbox dev connect`: the export line, a client served, and on SIGTERM nothing left."""
    port, work = free_port(), tmp_path / "dev"
    command = Job(
        ["-m", "outbox", "dev", "connect", "--dir", str(work), "--port", str(port)], tmp_path / "dev.log", {}
    )
    url = f"sc://127.0.0.1:{port}"
    command.wait_for_output(f"export SPARK_REMOTE={url}", 180)
    produce_transaction(transactional_producer(bootstrap), topic, [(b"k", b"v")])
    assert [row[2:] for row in probe(url, tmp_path, "read", bootstrap, topic)] == [["k", "v"]]
    command.process.send_signal(signal.SIGTERM)
    assert command.wait(60) == 0, command.output()
    assert not port_in_use(port)
    assert not [pid for pid in pids() if cmdline_contains(pid, str(work))], "a process outlived the command"


def pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
