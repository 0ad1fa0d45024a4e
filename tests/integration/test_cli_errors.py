"""Bad input gets one clear line, never a traceback, and never a password."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg

from outbox.core.config import DatabaseUrl
from tests.cli import assert_one_line_error, outbox
from tests.helpers import REPO, OwnPostgres, unique


def test_malformed_database_url() -> None:
    result = outbox("db", "current", env={"DATABASE_URL": "postgresql://u:hunter2@db:port/app"})
    assert_one_line_error(result, "DATABASE_URL")
    assert result.err.startswith("outbox: error: [CONFIG_DATABASE_URL_HOST_INVALID] "), result.err
    assert "hunter2" not in result.err


def test_wrong_scheme() -> None:
    result = outbox("db", "upgrade", "--url", "mysql://db/app")
    assert_one_line_error(result, "--url")
    assert result.err.startswith("outbox: error: [CONFIG_DATABASE_URL_SCHEME] "), result.err


def test_unreachable_database_hides_the_password() -> None:
    result = outbox("db", "upgrade", env={"DATABASE_URL": "postgresql://u:hunter2@127.0.0.1:1/app"})
    assert_one_line_error(result, "postgresql://u:***@127.0.0.1:1/app")
    assert result.err.startswith("outbox: error: [POSTGRES_UNREACHABLE] "), result.err
    assert "hunter2" not in result.err


def test_a_password_with_a_raw_question_mark_connects_and_is_never_shown(database: DatabaseUrl) -> None:
    """libpq reads a raw '?' in a password as part of it; our rewrite of the URL cut it there, and
    libpq's refusal of the cut printed the password's tail."""
    user, rest = database.raw.split("://", 1)[1].split("@", 1)
    raw = f"postgresql://{user.partition(':')[0]}:Zq9?Secret!Kw7@{rest}"
    for command in (["db", "upgrade"], ["db", "current"]):
        result = outbox(*command, env={"DATABASE_URL": raw})
        assert result.code == 0, result
        assert "Secret" not in result.out + result.err, result


def test_migrations_take_the_several_hosts_an_ha_url_names(database: DatabaseUrl) -> None:
    """libpq tries each host in turn; SQLAlchemy read the list as one host with port '1,127...'."""
    user, rest = database.raw.split("://", 1)[1].split("@", 1)
    raw = f"postgresql://{user}@127.0.0.1:1,{rest}"
    for command in (["db", "upgrade"], ["db", "current"]):
        result = outbox(*command, env={"DATABASE_URL": raw})
        assert result.code == 0 and "Traceback" not in result.err, result


def test_missing_database_url() -> None:
    result = outbox("db", "current")
    assert_one_line_error(result, "DATABASE_URL")
    assert result.err.startswith("outbox: error: [CONFIG_DATABASE_URL_MISSING] "), result.err


def test_unreachable_kafka(server_url: DatabaseUrl) -> None:
    result = outbox(
        "check",
        "--no-java",
        env={
            "DATABASE_URL": server_url.raw,
            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        },
    )
    assert result.code == 1
    kafka = [line for line in result.out.splitlines() if "kafka" in line]
    assert kafka == [kafka[0]] and kafka[0].startswith("FAIL kafka: [KAFKA_UNREACHABLE] "), kafka
    assert "cannot reach Kafka at 127.0.0.1:1" in kafka[0]
    assert "Traceback" not in result.err and "rdkafka" not in result.err


def test_port_already_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = outbox("dev", "up", "--dir", str(tmp_path / "dev"), "--pg-port", str(port))
    assert_one_line_error(result, f"port {port} ")
    assert result.err.startswith("outbox: error: [DEV_PORT_IN_USE] "), result.err
    assert not (tmp_path / "dev" / "state.json").exists(), "nothing may start when a port is taken"


def test_unknown_revision(server_url: DatabaseUrl) -> None:
    result = outbox("db", "upgrade", "nope", env={"DATABASE_URL": server_url.raw})
    assert_one_line_error(result, "Can't locate revision identified by 'nope'")
    assert result.err.startswith("outbox: error: [DB_MIGRATION_FAILED] "), result.err


def test_missing_java_stops_the_demo_before_anything_starts(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    proc = subprocess.run(
        [sys.executable, "-m", "demos.smoke", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**env, "PATH": str(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: error: [JAVA_MISSING] Spark "), proc.stderr
    assert "apt-get install openjdk-17-jre-headless" in lines[0]
    assert not (tmp_path / "demo").exists()


def test_relay_needs_a_name(database) -> None:  # type: ignore[no-untyped-def]
    result = outbox("relay", "--url", database.raw, "--bootstrap-servers", "127.0.0.1:9", env={})
    assert_one_line_error(result, "--name")
    assert result.err.startswith("outbox: error: [RELAY_NAME_REQUIRED] "), result.err


def test_relay_names_the_missing_tables(database, bootstrap) -> None:  # type: ignore[no-untyped-def]
    result = outbox(
        "relay",
        "--name",
        "r",
        "--metrics-address",
        "off",
        env={"DATABASE_URL": database.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
    )
    assert result.code == 2, result
    missing = (
        "public.outbox_events, public.relay_dead_letters, public.outbox_identity, public.relay_positions"
        " are missing"
    )
    assert f"outbox: error: [TABLES_MISSING] tables {missing}" in result.err
    assert "outbox db upgrade" in result.err


def test_relay_gives_up_on_an_unreachable_database_without_leaking_the_password() -> None:
    url = "postgresql://app:hunter2@127.0.0.1:9/db"
    result = outbox(
        "relay",
        "--name",
        "r",
        "--url",
        url,
        "--bootstrap-servers",
        "127.0.0.1:9",
        "--max-retries",
        "1",
        "--metrics-address",
        "off",
    )
    assert result.code == 2, result
    assert result.err.strip().splitlines()[-1].startswith("outbox: error: [RELAY_GAVE_UP] "), result.err
    assert (
        "giving up after 1 retries: cannot reach PostgreSQL at postgresql://app:***@127.0.0.1:9/db"
        in result.err
    )
    assert "hunter2" not in result.err + result.out


def test_relay_hides_a_password_given_as_a_query_parameter() -> None:
    url = "postgresql://app@127.0.0.1:9/db?sslmode=disable&password=hunter2"
    result = outbox(
        "relay", "--name", "r", "--url", url, "--bootstrap-servers", "127.0.0.1:9",
        "--max-retries", "0", "--metrics-address", "off",
    )  # fmt: skip
    assert result.code == 2, result
    assert result.err.strip().splitlines()[-1].startswith("outbox: error: [RELAY_GAVE_UP] "), result.err
    assert (
        "cannot reach PostgreSQL at postgresql://app@127.0.0.1:9/db?sslmode=disable&password=***"
        in result.err
    )
    assert "hunter2" not in result.err + result.out


def test_relay_names_an_unreachable_kafka_and_why_once_per_attempt(database) -> None:  # type: ignore[no-untyped-def]
    from outbox import migrate
    from outbox_dev.process import free_port

    migrate.upgrade(database, "public")
    servers = f"127.0.0.1:{free_port()}"
    result = outbox(
        "relay", "--name", "r", "--url", database.raw, "--bootstrap-servers", servers,
        "--max-retries", "1", "--metrics-address", "off", "--log-format", "text",
    )  # fmt: skip
    assert result.code == 2, result
    lines = result.err.strip().splitlines()
    about_kafka = [line for line in lines[1:] if "Kafka" in line or "rdkafka" in line or servers in line]
    assert "INFO outbox.relay: starting" in lines[0]
    # One "session ended, retrying" line, then the final error: each names the servers and the cause.
    assert len(about_kafka) == 2, result.err
    for line in about_kafka:
        # librdkafka's cause: the refused connection, or, when its broker-down event comes first on a
        # busy machine, "1/1 brokers are down"; either way the servers are named.
        assert f"cannot reach Kafka at {servers}" in line, line
        assert "Connection refused" in line or "brokers are down" in line, line
    assert lines[-1].startswith("outbox: error: [RELAY_GAVE_UP] giving up after 1 retries: "), lines[-1]
    assert f"cannot reach Kafka at {servers}" in lines[-1], lines[-1]


def test_a_relay_told_to_stop_while_starting_exits_cleanly(tmp_path: Path) -> None:
    """SIGTERM during start-up (imports, connecting) is a request to stop, answered with exit 0."""
    import signal

    from tests.helpers import Job, wait_for

    env = {"DATABASE_URL": "postgresql://u@127.0.0.1:9/db", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    job = Job(["-m", "outbox", "relay", "--name", "r", "--metrics-address", "off"], tmp_path / "r.log", env)
    # Signal as soon as the handler is in (before the heavy imports): not after a fixed sleep,
    # which a busy machine can outrun.
    wait_for(lambda: catches(job.process.pid, signal.SIGTERM), 30, "the relay to catch SIGTERM")
    job.process.send_signal(signal.SIGTERM)
    assert job.wait(30) == 0, job.output()


def catches(pid: int, sig: int) -> bool:
    """Whether process pid has a handler for sig (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (sig - 1) & 1)


def refused_at_once(database, bootstrap: str, code: str, *flags: str) -> str:  # type: ignore[no-untyped-def]
    """Run a relay on a migrated database; it must exit with `code` in one line, not retry. The line."""
    from outbox import migrate

    migrate.upgrade(database, "public")
    result = outbox(
        "relay", "--name", "r", "--url", database.raw, "--bootstrap-servers", bootstrap,
        "--metrics-address", "off", *flags,
    )  # fmt: skip
    assert result.code == 2, result
    last = result.err.strip().splitlines()[-1]
    assert last.startswith(f"outbox: error: [{code}] "), result.err
    assert "session ended, retrying" not in result.err, result.err
    return last


def test_a_setting_the_broker_refuses_stops_the_relay_at_once_with_its_reason(database, bootstrap) -> None:  # type: ignore[no-untyped-def]
    """The broker refuses a transaction timeout above its transaction.max.timeout.ms (15 minutes by
    default) at init_transactions: no retry can change that, so the relay exits with one line."""
    flags = ("-X", "transaction.timeout.ms=3600000")
    last = refused_at_once(database, bootstrap, "RELAY_KAFKA_SETTING_REFUSED", *flags)
    assert "transaction.timeout.ms" in last and bootstrap in last, last


def test_a_positions_topic_kafka_cannot_create_stops_the_relay_with_one_line(database, bootstrap) -> None:  # type: ignore[no-untyped-def]
    """A refusal of the creation (here a name Kafka does not take) is said at once; a creation Kafka
    does not answer (a timeout, a broker leaving in a restart) ends the session only, and is asked
    again (tests/unit/test_relay_unit.py)."""
    flags = ("--positions-topic", "no/slash")
    assert "no/slash" in refused_at_once(database, bootstrap, "RELAY_POSITIONS_TOPIC_NOT_CREATED", *flags)


def test_a_role_without_rights_on_the_schema_gets_one_line(database: DatabaseUrl) -> None:
    """Reading the applied revision was outside the one-line errors: a traceback from SQLAlchemy."""
    role = unique("reader")
    with psycopg.connect(database.libpq, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        assert outbox("db", "upgrade", "--schema", "locked", env={"DATABASE_URL": database.raw}).code == 0
        as_reader = f"postgresql://{role}@{database.raw.split('@', 1)[1]}"
        for command in (["db", "current"], ["db", "upgrade"]):
            result = outbox(*command, "--schema", "locked", env={"DATABASE_URL": as_reader})
            assert_one_line_error(result, "permission denied for schema locked")
    finally:
        with psycopg.connect(database.libpq, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


def test_check_fails_a_standby_the_relay_and_the_sink_cannot_write_to(
    tmp_path: Path, durable_postgres, bootstrap: str
) -> None:  # type: ignore[no-untyped-def]
    """It said "ok postgres" for a read-only standby, which the relay waits on and the sink fails on."""
    replica = OwnPostgres(durable_postgres.copy(tmp_path / "replica", standby=True), durable=True)
    try:
        env = {"DATABASE_URL": replica.url.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        result = outbox("check", "--no-java", env=env)
        [line] = [line for line in result.out.splitlines() if " postgres: " in line]
        assert line.startswith("FAIL postgres: [POSTGRES_STANDBY] ") and "target_session_attrs" in line, line
        assert result.code == 1
    finally:
        replica.stop()
