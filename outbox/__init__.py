"""Transactional outbox and exactly-once relay from PostgreSQL to Kafka."""

from core.errors import ConfigError, OutboxError, ServiceUnavailable

__all__ = ["ConfigError", "OutboxError", "ServiceUnavailable"]
__version__ = "0.1.0"
