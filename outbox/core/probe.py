"""Reach PostgreSQL and Kafka once, turning driver failures into one clear line.

Called before real work starts, so an unreachable service is reported as such
instead of as a stack trace from deep inside a job.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from outbox.core.config import DatabaseUrl
from outbox.core.errors import error
from outbox.core.kafka import client_settings
from outbox.core.postgres import connect


def check_postgres(url: DatabaseUrl, timeout: float = 5.0, *, writable: bool = False) -> str:
    """Connect once; return the server version string. writable: a standby (in recovery) is an
    error, as the relay and the sink write."""
    with connect(url, timeout=timeout) as conn:
        version, standby = conn.execute(
            "SELECT current_setting('server_version'), pg_is_in_recovery()"
        ).fetchone()  # type: ignore[misc]  # a query that always returns one row
    if writable and standby:
        raise error("POSTGRES_STANDBY", url=url.safe)
    return str(version)


def check_kafka(bootstrap: str, timeout: float = 10.0, config: dict[str, object] | None = None) -> int:
    """Fetch cluster metadata once; return the number of brokers."""
    admin = AdminClient(client_settings(config or {}, "admin", bootstrap=bootstrap))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise error(
            "KAFKA_UNREACHABLE", servers=bootstrap, reason=exc.args[0].str() if exc.args else exc
        ) from None
    return len(metadata.brokers)
