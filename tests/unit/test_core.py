"""The ground floor: one line per PostgreSQL failure, the tables check's words, Kafka settings per role."""

from __future__ import annotations

import logging

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError, ServiceUnavailable
from outbox.core.kafka import client_settings
from outbox.core.postgres import connect, first_line, reason

URL = DatabaseUrl.parse("postgresql://app:s3cr%40t@127.0.0.1:9/db?sslpassword=other")


def test_a_failure_is_its_first_line_and_carries_no_secret() -> None:
    exc = psycopg.OperationalError('connection to "postgresql://app:s3cr%40t@h/db" failed: s3cr@t\nDETAIL: x')
    assert first_line(exc) == 'connection to "postgresql://app:s3cr%40t@h/db" failed: s3cr@t'
    assert "s3cr" not in reason(exc, URL)
    assert first_line(psycopg.OperationalError()) == "OperationalError"


def test_an_unreachable_server_is_one_line_naming_it_without_the_password() -> None:
    with pytest.raises(ServiceUnavailable) as raised:
        connect(URL, timeout=1)
    message = str(raised.value)
    assert raised.value.code == "POSTGRES_UNREACHABLE"
    assert "postgresql://app:***@127.0.0.1:9/db" in message  # the server, its password masked
    assert "\n" not in message and "s3cr" not in message and "other" not in message


def test_missing_tables_name_each_and_the_command_that_creates_them() -> None:
    one = tables.missing_tables("app", [tables.SINK_PROGRESS], URL)
    assert isinstance(one, ConfigError) and one.code == "TABLES_MISSING"
    assert one.message == (
        "table app.sink_progress is missing in postgresql://app:***@127.0.0.1:9/db?sslpassword=***:"
        " run `outbox db upgrade --schema app` first"
    )
    two = tables.missing_tables("public", [tables.OUTBOX_EVENTS, tables.OUTBOX_IDENTITY])
    assert two.code == "TABLES_MISSING" and two.message == (
        "tables public.outbox_events, public.outbox_identity are missing:"
        " run `outbox db upgrade --schema public` first"
    )


SHARED = {
    "bootstrap.servers": "b:9092",
    "client.id": "me",
    "security.protocol": "SASL_SSL",
    "message.max.bytes": "2000000",
    "retry.backoff.ms": "200",
}
PRODUCER = {"linger.ms": "5", "compression.type": "zstd", "transactional.id": "t", "acks": "all"}
CONSUMER = {"group.id": "g", "isolation.level": "read_committed", "fetch.min.bytes": "1"}


@given(st.sets(st.sampled_from(sorted({**SHARED, **PRODUCER, **CONSUMER}))))
def test_each_role_gets_the_shared_keys_and_its_own_only(keys: set[str]) -> None:
    settings = {k: {**SHARED, **PRODUCER, **CONSUMER}[k] for k in keys}
    own = {"producer": PRODUCER, "consumer": CONSUMER, "admin": {}}
    for role, mine in own.items():
        got = client_settings(settings, role)  # type: ignore[arg-type]
        assert "logger" in got, "librdkafka's log goes to Python logging"
        del got["logger"]
        assert got == {k: v for k, v in settings.items() if k in SHARED or k in mine}, role


def test_bootstrap_given_apart_wins() -> None:
    got = client_settings({"bootstrap.servers": "old:1"}, "admin", bootstrap="new:2")
    assert got["bootstrap.servers"] == "new:2"


def test_the_kafka_clients_log_passes_only_where_a_level_was_set_and_the_library_sets_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import importlib

    import outbox.core.kafka

    client = logging.getLogger(outbox.core.kafka.CLIENT_LOG)
    client.setLevel(logging.NOTSET)
    importlib.reload(outbox.core.kafka)  # importing sets no level on any logger
    assert client.level == logging.NOTSET
    log = client_settings({}, "consumer")["logger"]
    with caplog.at_level(logging.DEBUG):  # the root at DEBUG: still not librdkafka's flood
        log.log(logging.WARNING, "%s-%s: %s", "FAIL", "rdkafka#consumer-1", "connection refused")
    assert not [r for r in caplog.records if r.name == outbox.core.kafka.CLIENT_LOG]
    client.setLevel(logging.WARNING)
    try:
        with caplog.at_level(logging.DEBUG):
            log.log(logging.WARNING, "%s-%s: %s", "FAIL", "rdkafka#consumer-1", "connection refused")
            log.log(logging.DEBUG, "%s-%s: %s", "BRKMAIN", "rdkafka#consumer-1", "started")
    finally:
        client.setLevel(logging.NOTSET)
    said = [r.getMessage() for r in caplog.records if r.name == outbox.core.kafka.CLIENT_LOG]
    assert said == ["FAIL-rdkafka#consumer-1: connection refused"]
