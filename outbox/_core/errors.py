"""Errors a user can act on.

Anything raised as an :class:`OutboxError` is printed by the CLI as one line,
without a traceback, so its message must say what went wrong and what to do.
"""

from __future__ import annotations


class OutboxError(Exception):
    """A failure the user can fix: bad input, a missing tool, a service not reachable."""


class ConfigError(OutboxError):
    """A setting (flag or environment variable) is missing or malformed."""


class ServiceUnavailable(OutboxError):
    """PostgreSQL or Kafka could not be reached."""


class Standby(ServiceUnavailable):
    """The PostgreSQL server reached is a standby (in recovery): nothing can be written there yet."""


class Fenced(ServiceUnavailable):
    """Another instance with the same relay name and shard took over; this one must stop publishing."""


class DataLossError(OutboxError):
    """Offsets a query needs are gone from the broker (retention, a deleted topic)."""
