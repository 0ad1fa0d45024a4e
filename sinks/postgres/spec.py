"""What a sink is asked to do, checked before anything runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from outbox._core.config import DatabaseUrl
from outbox._core.errors import ConfigError
from sinks.postgres.placement import ApplyIn

Mode = Literal["upsert", "insert"]
OnError = Literal["dead_letter", "fail"]


@dataclass(frozen=True)
class Outbox:
    """Outbox events to add for every row the sink changes, in the same transaction.

    `key`, `value` and the header values are SQL expressions over the changed
    row, named `written` (e.g. `written.order_id::text`, `to_jsonb(written)`).
    They are your job's code, like a view definition: never build them from
    event data. A deleted row gets a NULL value (a Kafka tombstone).
    """

    topic: str
    key: str | None = None
    value: str = "to_jsonb(written)"
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SinkSpec:
    url: DatabaseUrl
    table: str
    schema: str = "public"
    key: tuple[str, ...] = ("event_id",)
    mode: Mode = "upsert"
    version: str | None = None
    on_error: OnError = "dead_letter"
    outbox: Outbox | None = None
    ledger_schema: str = "public"
    name: str = ""
    apply_in: ApplyIn = "auto"
    database_timeout: float = 30.0  # seconds; see `silence` and `retry_for`
    trace: bool = False  # record each input record's outcome for `outbox trace` (outbox/_core/trace.py)

    @property
    def silence(self) -> float:
        """Seconds after which the server ends a task's session that went quiet (its client lost):
        a healthy task sends its statements back to back, its rows already in memory."""
        return 2 * self.database_timeout

    @property
    def retry_for(self) -> float:
        """Seconds a task keeps starting over on lost connections and deadlocks before it fails,
        for Spark to run it again (on another executor, with spark.excludeOnFailure.taskAndStage.enabled)."""
        return 4 * self.database_timeout

    def __post_init__(self) -> None:
        if not self.table:
            raise ConfigError("the sink needs a table name")
        if not self.key:
            raise ConfigError("the sink needs at least one key column (default: event_id)")
        if len(set(self.key)) != len(self.key):
            raise ConfigError(f"key columns repeat: {list(self.key)}")
        if self.mode not in ("upsert", "insert"):
            raise ConfigError(f"mode must be 'upsert' or 'insert', not {self.mode!r}")
        if self.on_error not in ("dead_letter", "fail"):
            raise ConfigError(f"on_error must be 'dead_letter' or 'fail', not {self.on_error!r}")
        if self.apply_in not in ("auto", "tasks", "driver"):
            raise ConfigError(f"apply_in must be 'auto', 'tasks' or 'driver', not {self.apply_in!r}")
        if not self.database_timeout > 0:
            raise ConfigError(
                f"database_timeout must be a positive number of seconds, got {self.database_timeout}"
            )
        if self.version is not None and self.version in self.key:
            raise ConfigError(f"the version column {self.version!r} cannot also be a key column")
        if self.version is not None and self.mode == "insert":
            raise ConfigError("a version column needs mode='upsert': mode='insert' never replaces a row")
        if self.outbox is not None and not self.outbox.topic:
            raise ConfigError("Outbox needs a topic")
        if not self.name:
            object.__setattr__(self, "name", f"{self.schema}.{self.table}")
