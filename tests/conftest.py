"""Fixtures wired to real services: PostgreSQL, a Kafka broker, one SparkSession.

Services come from, in order: DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set;
Docker containers with `--services=docker` (or OUTBOX_TEST_SERVICES=docker);
else embedded ones started for this run, which die with it even on kill -9.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from hypothesis import settings

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox_dev.connect import ConnectServer
from outbox_dev.kafka import Broker
from outbox_dev.process import PORT_SHARE
from outbox_dev.stack import running
from tests import containers, spark_conf
from tests.helpers import MEASURED, REPO, OwnPostgres, create_topic, fresh_database, unique
from tests.sink_support import ORDERS


def pytest_configure(config: pytest.Config) -> None:
    # `--basetemp=.tmp/pytest` keeps scratch files in the checkout; pytest wants its parent to exist.
    if config.option.basetemp:
        Path(config.option.basetemp).parent.mkdir(parents=True, exist_ok=True)
    # Every Spark JVM a test starts, in this process or a job's, reads one conf (tests/spark_conf.py
    # says why), written with its class-data archive by the run's first process, before any worker.
    scratch = REPO / ".tmp"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    conf_dir = scratch / "spark-conf" if worker else spark_conf.prepare(scratch)
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
    # Each test worker (and what it starts) chooses service ports from a share of its own: another
    # worker's service never binds a port one of ours chose and has yet to bind.
    if worker:
        count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
        os.environ[PORT_SHARE] = f"{worker.removeprefix('gw')}/{count}"


# Hypothesis's 200 ms deadline per example measures the machine, not the rule: the workers share
# two cores with brokers and Spark. Each property still runs all its examples.
settings.register_profile("shared-cores", deadline=None)
settings.load_profile("shared-cores")

LEVELS = ("unit", "integration", "faults")


# Fault files of one to three tests, each a minute or two of Spark or relay restarts. Ordered by
# their count of tests, as xdist orders files, they came last, and a run ended with one worker
# alone on them for a minute or more. (test_connect_faults.py stays in its place: beside another
# Spark Connect server, its late-start test's worker missed Spark's 10 s to connect back.)
LONG_FEW = (
    "test_postgres_sink_crash.py",
    "test_sink_routing_faults.py",
    "test_demo.py",
    "test_relay_storms.py",
    "test_kafka_source_faults.py",
    "test_sink_avro_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its level, the folder it lives in: `-m unit`, `-m "not faults"`.

    Then the files are put in the order `make test`'s workers take them (xdist's loadfile, with
    --no-loadscope-reorder): LONG_FEW first, then the rest by their count of tests, most first,
    as xdist itself would order them."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        level = next((part for part in item.path.parts if part in LEVELS), None)
        if level is not None:
            item.add_marker(level)
        files.setdefault(item.path, []).append(item)

    def turn(path: Path) -> tuple[int, int]:
        first = LONG_FEW.index(path.name) if path.name in LONG_FEW else len(LONG_FEW)
        return first, -len(files[path])

    items[:] = [item for path in sorted(files, key=turn) for item in files[path]]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """What the test measured rides on its report, which pytest-xdist carries from its worker."""
    report: pytest.TestReport = yield
    report.user_properties.extend(("measured", line) for line in MEASURED)
    MEASURED.clear()
    return report


SEEN: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    SEEN.extend(str(line) for key, line in report.user_properties if key == "measured")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the fault tests measured (heal to resume, a soak's), one line each."""
    if SEEN:
        terminalreporter.section("measured")
        for line in SEEN:
            terminalreporter.write_line(line)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--services",
        choices=["embedded", "docker"],
        default=os.environ.get("OUTBOX_TEST_SERVICES", "embedded"),
        help="where PostgreSQL and Kafka come from when the env vars do not name them",
    )


@pytest.fixture(scope="session")
def services(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    given = {k: v for k in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS") if (v := os.environ.get(k))}
    if len(given) == 2:
        yield given
        return
    if request.config.getoption("--services") == "docker":
        reason = containers.docker_unavailable_reason()
        if reason:
            pytest.skip(f"--services=docker: {reason}")
        with containers.services() as started:
            yield {**started, **given}
        return
    with running(tmp_path_factory.mktemp("services"), environ=given) as started:
        yield {**started, **given}


@pytest.fixture(scope="session")
def server_url(services: dict[str, str]) -> DatabaseUrl:
    return DatabaseUrl.parse(services["DATABASE_URL"])


@pytest.fixture(scope="session")
def bootstrap(services: dict[str, str]) -> str:
    return services["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture
def database(server_url: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A fresh, empty database for one test, dropped afterwards."""
    with fresh_database(server_url) as url:
        yield url


@pytest.fixture
def pg(database: DatabaseUrl) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database.libpq, autocommit=True) as conn:
        yield conn


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A Kafka broker for this test alone, which it may restart or kill."""
    broker = Broker(tmp_path / "kafka")
    yield broker
    broker.stop()


@pytest.fixture
def outbox_db(database: DatabaseUrl) -> DatabaseUrl:
    """A fresh database migrated to head in schema public."""
    migrate.upgrade(database, "public")
    return database


@pytest.fixture
def db(outbox_db: DatabaseUrl, pg: psycopg.Connection) -> DatabaseUrl:
    """A migrated database with the sink tests' `orders` table."""
    pg.execute(ORDERS)
    return outbox_db


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    """A PostgreSQL server of this test's own, migrated, with `orders`: the test may restart it."""
    server = OwnPostgres(tmp_path / "pg")
    migrate.upgrade(server.url, "public")
    with psycopg.connect(server.url.libpq, autocommit=True) as conn:
        conn.execute(ORDERS)
    yield server
    server.stop()


@pytest.fixture
def durable_postgres(tmp_path: Path) -> Iterator[OwnPostgres]:
    """A migrated server of this test's own, durable as production runs it, to crash, copy or promote.

    The WAL writer wakes every 10 s (its longest), so what it alone would flush
    stays unflushed long enough for a crash to lose it.
    """
    server = OwnPostgres(tmp_path / "primary", durable=True, settings={"wal_writer_delay": "10s"})
    migrate.upgrade(server.url, "public")
    yield server
    server.stop()


@pytest.fixture
def env(outbox_db: DatabaseUrl, bootstrap: str) -> dict[str, str]:
    """The environment a relay process needs, for the migrated database and the shared broker."""
    return {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}


@pytest.fixture
def topic(bootstrap: str) -> str:
    return create_topic(bootstrap, unique("topic"), partitions=2)


@pytest.fixture
def events_topic(bootstrap: str) -> str:
    return create_topic(bootstrap, unique("events"), partitions=3)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from outbox_dev.local_spark import kafka_connector_jars, local_session, stop_session
    from sinks.kafka_source import register

    # Spark's own Kafka source too, for the tests that compare kafka_rc with it.
    session = local_session(
        tmp_path_factory.mktemp("spark"), app_name="outbox-tests", jars=kafka_connector_jars()
    )
    register(session)
    yield session
    stop_session(session)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2]) for the run, with Spark's own Kafka source too: clients
    reach it as `connect_server.url`, from jobs of their own (SPARK_REMOTE), since a process
    holds either a classic session or a Connect one."""
    from outbox_dev.local_spark import kafka_connector_jars

    root = tmp_path_factory.mktemp("connect")
    with ConnectServer(root, jars=kafka_connector_jars(), env={"PYTHONPATH": str(REPO)}) as server:
        yield server


class RunningRegistry(NamedTuple):
    url: str  # Confluent's API
    pid: int  # to stop (SIGSTOP) and resume it

    def client(self) -> SchemaRegistryClient:
        """Confluent's client, for what a test writes itself. Apicurio now and then leaves a
        request unanswered (seen in CI: a fresh connection, no reply in 300 s). Such a request
        times out and is sent again, rather than hanging the test."""
        return SchemaRegistryClient({"url": self.url, "timeout": 10, "max.retries": 3})


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    """A schema registry serving Confluent's API for the run: Apicurio, schemas in memory."""
    from outbox_dev import registry as apicurio
    from outbox_dev.process import free_port, stop

    service = apicurio.start(tmp_path_factory.mktemp("registry"), free_port(), die_with_parent=True)
    try:
        yield RunningRegistry(service.env[apicurio.SCHEMA_REGISTRY_URL], service.pid)
    finally:
        stop(service.pid)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return tmp_path / "checkpoint"
