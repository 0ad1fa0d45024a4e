"""docker/ stays consistent with the code: env var names, ports, listeners, commands."""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest
import yaml

from outbox.cli import build_parser
from outbox.core import config
from outbox.relay.settings import SETTINGS
from tests.helpers import REPO

COMPOSE = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
APP = [name for name, svc in SERVICES.items() if "build" in svc]
RELAY_VARS = {setting.env for setting in SETTINGS}
KNOWN_VARS = {config.DATABASE_URL, config.KAFKA_BOOTSTRAP_SERVERS, config.OUTBOX_SCHEMA} | RELAY_VARS


def listeners(value: str) -> dict[str, str]:
    return dict(item.split("://", 1) for item in value.split(","))


def published(service: str) -> dict[int, int]:
    return {int(c): int(h) for h, c in (p.split(":") for p in SERVICES[service]["ports"])}


def test_app_services_use_only_the_variables_the_code_reads() -> None:
    assert APP, "no application services in compose.yaml"
    for name in APP:
        assert set(SERVICES[name]["environment"]) <= KNOWN_VARS, name


def test_database_url_points_at_the_postgres_service() -> None:
    for name in APP:
        url = config.DatabaseUrl.parse(SERVICES[name]["environment"]["DATABASE_URL"])
        host_port = url.libpq.split("@", 1)[1].split("/", 1)[0]
        assert host_port == "postgres:5432", name
        assert url.password == SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert published("postgres") == {5432: 5432}


def test_kafka_listeners_match_the_bootstrap_servers() -> None:
    env = SERVICES["kafka"]["environment"]
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    for name in APP:
        assert SERVICES[name]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == advertised["INTERNAL"]
    external_port = int(advertised["EXTERNAL"].rsplit(":", 1)[1])
    assert published("kafka") == {external_port: external_port}
    bound = listeners(env["KAFKA_LISTENERS"])
    assert {n: p.rsplit(":", 1)[1] for n, p in bound.items()} == {
        "INTERNAL": "19092",
        "EXTERNAL": str(external_port),
        "CONTROLLER": "9093",
    }


def test_single_broker_can_run_transactions() -> None:
    env = SERVICES["kafka"]["environment"]
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


@pytest.mark.parametrize("service", APP)
def test_commands_exist(service: str) -> None:
    command = SERVICES[service]["command"]
    if command[0] == "outbox":
        build_parser().parse_args(command[1:])  # exits (fails the test) on an unknown command
    else:
        assert command[:2] == ["python", "-m"]
        assert importlib.util.find_spec(command[2]) is not None, command


def stages() -> dict[str, tuple[set[str], bool]]:
    """Per image (a Dockerfile stage, with the stages it builds on): what it copies, whether it has Java."""
    found: dict[str, tuple[set[str], bool]] = {}
    text = (REPO / "docker" / "Dockerfile").read_text()
    for base, name, body in re.findall(r"^FROM (\S+) AS (\S+)$(.*?)(?=^FROM |\Z)", text, re.M | re.S):
        copied, java = found.get(base, (set(), False))
        found[name] = (copied | set(re.findall(r"^COPY (\S+) \1$", body, re.M)), java or "openjdk-17" in body)
    return found


@pytest.mark.parametrize("service", APP)
def test_each_image_has_what_its_commands_need_and_the_relays_no_java(service: str) -> None:
    copied, java = stages()[SERVICES[service]["build"]["target"]]
    assert {"outbox", "sinks", "migrations"} <= copied, service
    if SERVICES[service]["command"][0] == "outbox":
        assert not java, f"{service}: the runtime image needs no JRE"
    else:  # a Spark job or the demo
        assert java and {"demos", "devtools"} <= copied, service


def test_compose_header_shows_the_host_settings_it_publishes() -> None:
    header = (REPO / "docker" / "compose.yaml").read_text().split("name:", 1)[0]
    exports = dict(
        shlex.split(line.split("export ", 1)[1])[0].split("=", 1)
        for line in header.splitlines()
        if "export " in line
    )
    assert (
        exports["KAFKA_BOOTSTRAP_SERVERS"]
        == listeners(SERVICES["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])["EXTERNAL"]
    )
    url = config.DatabaseUrl.parse(exports["DATABASE_URL"])
    assert url.raw.endswith("@localhost:5432/postgres")


def test_relay_service_is_named_and_serves_health_where_compose_looks() -> None:
    relay = SERVICES["relay"]
    assert relay["environment"]["OUTBOX_RELAY_NAME"]
    port = int(relay["environment"]["OUTBOX_RELAY_METRICS_ADDRESS"].rsplit(":", 1)[1])
    assert published("relay") == {port: port}
    assert f":{port}/readyz" in " ".join(relay["healthcheck"]["test"])
