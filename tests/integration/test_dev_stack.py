"""`outbox dev up | down | status`: idempotent, and clean after a killed run."""

import os
import signal
from pathlib import Path

import psycopg

from core.probe import check_kafka
from outbox.dev.process import cmdline_contains
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
