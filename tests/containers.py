"""Real Apache Kafka (KRaft) and PostgreSQL in Docker, for `pytest --services=docker`.

The Kafka listener is bound to the same port inside and outside the
container, so the address the broker advertises works from the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:18"


def docker_unavailable_reason() -> str | None:
    """Why the Docker path cannot run here, or None if it can."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
    except Exception as exc:  # any failure means: no usable engine
        return f"no Docker engine reachable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return None


@contextlib.contextmanager
def services() -> Iterator[dict[str, str]]:
    from testcontainers.community.postgres import PostgresContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    from outbox_dev.process import free_port

    port = free_port()
    kafka = (
        DockerContainer(KAFKA_IMAGE)
        .with_bind_ports(port, port)
        .with_envs(
            KAFKA_NODE_ID="1",
            KAFKA_PROCESS_ROLES="broker,controller",
            KAFKA_CONTROLLER_QUORUM_VOTERS="1@localhost:9093",
            KAFKA_LISTENERS=f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://0.0.0.0:9093",
            KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://localhost:{port}",
            KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
            KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
            KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        )
    )
    with PostgresContainer(POSTGRES_IMAGE, driver=None) as pg, kafka:
        wait_for_logs(kafka, "Kafka Server started", timeout=120)
        yield {
            "DATABASE_URL": pg.get_connection_url(),
            "KAFKA_BOOTSTRAP_SERVERS": f"localhost:{port}",
        }
