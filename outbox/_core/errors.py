"""Errors a user can act on, each with a stable code.

Anything raised as an :class:`OutboxError` is printed by the CLI as one line,
without a traceback, so its message must say what went wrong and what to do.
As in Spark's error-conditions file, each error has a code and a message
template, declared once in its half's table (:class:`Conditions`): the base's
below, the outbox's in outbox/errors.py, the sink's in sinks/errors.py, the dev
tools' in outbox_dev/errors.py. The code leads the message (`[CODE] words`),
so it survives Spark's wrapping of a failed query's error; code and tests
match codes, and the words may change. docs/errors.md lists them all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from string import Formatter


class OutboxError(Exception):
    """A failure the user can fix: bad input, a missing tool, a service not reachable.

    `code` names the condition; `message` is the words alone.
    """

    code = "OUTBOX_ERROR"  # an error raised without one

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


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


@dataclass(frozen=True)
class Condition:
    """An error's class and its message template (str.format fields, given by name at the raise)."""

    kind: type[OutboxError]
    template: str

    @property
    def fields(self) -> frozenset[str]:
        return frozenset(name for _, name, _, _ in Formatter().parse(self.template) if name)


class Conditions(Mapping[str, Condition]):
    """One half's error conditions, code -> Condition; `error(code, **fields)` makes one to raise."""

    def __init__(self, **table: Condition) -> None:
        self._table = table

    def __getitem__(self, code: str) -> Condition:
        return self._table[code]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def error(self, code: str, /, **fields: object) -> OutboxError:
        condition = self._table[code]
        return condition.kind(condition.template.format(**fields), code=code)

    def message(self, code: str, /, **fields: object) -> str:
        """The words alone, for an error class of its own (one with more than a message)."""
        return self._table[code].template.format(**fields)


def merged(*halves: Mapping[str, Condition]) -> dict[str, Condition]:
    """Every half's conditions in one table; a code declared twice is a bug."""
    out: dict[str, Condition] = {}
    for half in halves:
        twice = out.keys() & half.keys()
        assert not twice, f"error codes declared twice: {sorted(twice)}"
        out.update(half)
    return out
