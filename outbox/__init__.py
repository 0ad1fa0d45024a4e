"""Transactional outbox and exactly-once relay from PostgreSQL to Kafka.

writer.py    add_event / add_events: events in the caller's transaction
migrate.py   the framework's Alembic migrations, run from code (`outbox db`)
relay/       the relay daemon: outbox table -> Kafka, exactly once
verify/      `outbox verify`: a topic checked for duplicates, order, gaps
cli/         the `outbox` command; __main__.py its entry point
dev/         throwaway local services: PostgreSQL, Kafka, a Spark cluster
jvm/         Java and Maven: the jars the framework runs
logs.py      log lines as JSON or text; stopping.py: SIGTERM before start-up ends
"""

from outbox._core.errors import ConfigError, OutboxError, ServiceUnavailable

__all__ = ["ConfigError", "OutboxError", "ServiceUnavailable"]
__version__ = "0.1.0"
