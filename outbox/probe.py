"""Reach PostgreSQL and Kafka once, turning driver failures into one clear line.

Called before real work starts, so an unreachable service is reported as such
instead of as a stack trace from deep inside a job.
"""

from __future__ import annotations

import logging

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from outbox.config import DatabaseUrl
from outbox.errors import ServiceUnavailable

# librdkafka reports every failed connection attempt, dozens a second; route it
# to logging, silent unless debug logging asks for it (`outbox.logs.configure`).
# What matters of it reaches the user in the error of the call that failed.
KAFKA_CLIENT_LOG = "outbox.kafka"
_kafka_log = logging.getLogger(KAFKA_CLIENT_LOG)
_kafka_log.setLevel(logging.CRITICAL + 1)


def quiet_kafka_config(config: dict[str, object]) -> dict[str, object]:
    """A client config whose librdkafka log lines go to Python logging."""
    return {**config, "logger": _kafka_log}


def check_postgres(url: DatabaseUrl, timeout: float = 5.0) -> str:
    """Connect once; return the server version string."""
    try:
        with psycopg.connect(url.libpq, connect_timeout=max(1, int(timeout))) as conn:
            return str(conn.execute("show server_version").fetchone()[0])  # type: ignore[index]
    except psycopg.Error as exc:
        reason = url.scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise ServiceUnavailable(
            f"cannot reach PostgreSQL at {url.safe}: {reason}."
            " Check DATABASE_URL, or start a local server with `outbox dev up`."
        ) from None


def check_kafka(bootstrap: str, timeout: float = 10.0, config: dict[str, object] | None = None) -> int:
    """Fetch cluster metadata once; return the number of brokers."""
    admin = AdminClient(quiet_kafka_config({"bootstrap.servers": bootstrap, **(config or {})}))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"cannot reach Kafka at {bootstrap}: {exc.args[0].str() if exc.args else exc}."
            " Check KAFKA_BOOTSTRAP_SERVERS, or start a local broker with `outbox dev up`."
        ) from None
    return len(metadata.brokers)
