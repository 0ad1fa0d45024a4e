"""Transactional outbox and exactly-once relay from PostgreSQL to Kafka."""

from outbox.errors import ConfigError, OutboxError, ServiceUnavailable

__all__ = ["ConfigError", "OutboxError", "ServiceUnavailable"]
__version__ = "0.1.0"
