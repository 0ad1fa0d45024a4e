"""`outbox dev up | down | status`: idempotent, and clean after a killed run."""

import json
import os
import signal
from pathlib import Path

import psycopg
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from outbox.core.probe import check_kafka
from outbox_dev.process import cmdline_contains
from tests.cli import outbox


def exports(stdout: str) -> dict[str, str]:
    pairs = [
        line[len("export ") :].split("=", 1) for line in stdout.splitlines() if line.startswith("export ")
    ]
    return dict(pairs)


def our_processes(root: Path) -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and cmdline_contains(int(p.name), str(root.resolve()) + "/")
    ]


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    first = outbox("dev", "up", "--dir", str(root))
    assert first.code == 0, first
    env = exports(first.out)
    assert set(env) == {"DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS"}
    try:
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        assert check_kafka(env["KAFKA_BOOTSTRAP_SERVERS"]) == 1

        again = outbox("dev", "up", "--dir", str(root))
        assert again.code == 0 and exports(again.out) == env
        status = outbox("dev", "status", "--dir", str(root))
        assert status.code == 0 and exports(status.out) == env
    finally:
        down = outbox("dev", "down", "--dir", str(root))
    assert down.code == 0 and "stopped: postgres, kafka" in down.out
    assert not root.exists() and our_processes(root) == []
    assert outbox("dev", "down", "--dir", str(root)).code == 0
    assert outbox("dev", "status", "--dir", str(root)).code == 1


def test_up_recovers_from_a_killed_run(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    assert outbox("dev", "up", "--dir", str(root)).code == 0
    try:
        # A crash: the broker is killed, and the state file is lost with postgres still running.
        kafka_pid = next(p for p in our_processes(root) if cmdline_contains(p, "kafka"))
        os.kill(kafka_pid, signal.SIGKILL)
        (root / "state.json").unlink()
        assert our_processes(root), "postgres should still be running"

        status = outbox("dev", "status", "--dir", str(root))
        assert status.code == 1 and "nothing is running" in status.out

        again = outbox("dev", "up", "--dir", str(root))
        assert again.code == 0, again
        fresh = exports(again.out)
        with psycopg.connect(fresh["DATABASE_URL"]) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
        assert check_kafka(fresh["KAFKA_BOOTSTRAP_SERVERS"]) == 1
        assert len([p for p in our_processes(root) if cmdline_contains(p, "kafka.Kafka")]) == 1
    finally:
        outbox("dev", "down", "--dir", str(root))
    assert our_processes(root) == []


def test_services_given_by_env_are_not_started(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    given = {"DATABASE_URL": "postgresql://u:secret@db.example:5432/app", "KAFKA_BOOTSTRAP_SERVERS": "k:9092"}
    result = outbox("dev", "up", "--dir", str(root), env=given)
    assert result.code == 0
    assert exports(result.out) == {}
    assert "DATABASE_URL is set in the environment" in result.out
    assert "secret" not in result.out
    assert our_processes(root) == []


def test_up_with_a_registry_serves_confluents_api_and_down_leaves_nothing(tmp_path: Path) -> None:
    """The registry is asked for, not started by default; Confluent's own client registers a schema
    there and reads it back by id, and `down` leaves no process. PostgreSQL and Kafka are given,
    so only the registry starts."""
    root = tmp_path / "dev"
    given = {"DATABASE_URL": "postgresql://u@db.example:5432/app", "KAFKA_BOOTSTRAP_SERVERS": "k:9092"}
    assert exports(outbox("dev", "up", "--dir", str(root), env=given).out) == {}
    up = outbox("dev", "up", "--registry", "--dir", str(root), env=given)
    assert up.code == 0, up
    url = exports(up.out)["SCHEMA_REGISTRY_URL"]
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/apis/ccompat/v7"), url
        client = SchemaRegistryClient({"url": url})
        avro = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}'
        schema_id = client.register_schema("orders-value", Schema(avro, "AVRO"))
        assert json.loads(client.get_schema(schema_id).schema_str) == json.loads(avro)
        assert client.get_subjects() == ["orders-value"]
        assert exports(outbox("dev", "status", "--dir", str(root), env=given).out) == exports(up.out)
    finally:
        down = outbox("dev", "down", "--dir", str(root))
    assert down.code == 0 and "stopped: registry" in down.out, down
    assert our_processes(root) == []


def test_up_durable_runs_postgresql_as_production_does(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    up = outbox("dev", "up", "--durable", "--dir", str(root), env={"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"})
    assert up.code == 0, up
    try:
        with psycopg.connect(exports(up.out)["DATABASE_URL"]) as conn:
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0] for name in ("fsync", "synchronous_commit")
            }  # type: ignore[index]
        assert settings == {"fsync": "on", "synchronous_commit": "on"}
    finally:
        assert outbox("dev", "down", "--dir", str(root)).code == 0


def test_up_with_three_brokers_forms_one_replicated_cluster_whose_nodes_fail_on_demand(
    tmp_path: Path,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.helpers import produce_transaction, transactional_producer, wait_for

    root = tmp_path / "dev"
    up = outbox("dev", "up", "--brokers", "3", "--dir", str(root), env={"DATABASE_URL": "postgresql://x@h/d"})
    assert up.code == 0, up
    bootstrap = exports(up.out)["KAFKA_BOOTSTRAP_SERVERS"]
    try:
        assert len(bootstrap.split(",")) == 3 and check_kafka(bootstrap) == 3
        assert len([p for p in our_processes(root) if cmdline_contains(p, "kafka.Kafka")]) == 3
        # Every topic is replicated as production has it: one created without a factor, and the
        # transaction log a transactional producer brings into being.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("plain", 2)])["plain"].result(30)
        produce_transaction(transactional_producer(bootstrap), "plain", [(b"k", b"v")])
        topics = admin.list_topics(timeout=30).topics
        for name in ("plain", "__transaction_state"):
            assert {len(p.replicas) for p in topics[name].partitions.values()} == {3}, name

        def brokers(n: int) -> None:
            wait_for(
                lambda: len(admin.list_topics(timeout=10).brokers) == n, 60, f"{n} brokers in the metadata"
            )

        def broker(action: str, node: str) -> str:
            result = outbox("dev", "broker", action, node, "--dir", str(root))
            assert result.code == 0, result
            return result.out

        assert "kill: Kafka node 2" in broker("kill", "2")
        brokers(2)
        again = outbox("dev", "broker", "kill", "2", "--dir", str(root))
        assert again.err == (
            "outbox: error: [DEV_BROKER_NOT_RUNNING] Kafka node 2 is not running"
            " (`outbox dev broker start 2`)\n"
        )
        assert "started Kafka node 2" in broker("start", "2")
        brokers(3)
        broker("pause", "3")
        status = outbox("dev", "status", "--dir", str(root))
        assert status.code == 0, "a paused node is alive"
        broker("resume", "3")
        unknown = outbox("dev", "broker", "kill", "7", "--dir", str(root))
        assert unknown.err == "outbox: error: [DEV_BROKER_UNKNOWN] no Kafka node 7 here (nodes: [1, 2, 3])\n"
    finally:
        down = outbox("dev", "down", "--dir", str(root))
    assert down.code == 0 and "stopped: kafka-1, kafka-2, kafka-3" in down.out, down
    assert our_processes(root) == []
