"""What a sink is asked to do, checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.core.settings import check_all
from sinks.errors import error
from sinks.postgres import settings as S
from sinks.postgres.placement import ApplyIn
from sinks.postgres.settings import Mode, OnError, Outbox


@dataclass(frozen=True)
class SinkSpec:
    """The sink's settings (settings.py), resolved: the URL parsed, the key a tuple, the name given."""

    url: DatabaseUrl
    table: str
    schema: str = S.SCHEMA.default
    key: tuple[str, ...] = (S.KEY.default,)
    mode: Mode = S.MODE.default
    version: str | None = S.VERSION.default
    on_error: OnError = S.ON_ERROR.default
    outbox: Outbox | None = S.OUTBOX.default
    ledger_schema: str = "public"
    name: str = ""
    apply_in: ApplyIn = S.APPLY_IN.default
    database_timeout: float = S.DATABASE_TIMEOUT.default  # seconds; see `silence` and `retry_for`
    trace: bool = S.TRACE.default  # each input record's outcome, for `outbox trace` (outbox/core/trace.py)
    create: bool = S.CREATE.default  # make a missing table (evolve.py)
    evolve: bool = S.EVOLVE.default  # add the columns the table lacks (evolve.py)
    read_kafka: bool = S.READ_KAFKA.default  # the tasks read Kafka themselves where they can (direct.py)

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
            raise error("SINK_TABLE_UNNAMED")
        if not self.key:
            raise error("SINK_KEY_MISSING")
        if len(set(self.key)) != len(self.key):
            raise error("SINK_KEY_REPEATS", key=list(self.key))
        check_all(S.SETTINGS, self)
        if self.version is not None and self.version in self.key:
            raise error("SINK_VERSION_IS_KEY", version=self.version)
        if self.version is not None and self.mode == "insert":
            raise error("SINK_VERSION_NEEDS_UPSERT")
        if self.outbox is not None and not self.outbox.topic:
            raise error("SINK_OUTBOX_TOPIC_MISSING")
        if self.outbox is not None and tables.EVENT_ID_HEADER in self.outbox.headers:
            raise error("SINK_OUTBOX_HEADER_RESERVED", name=tables.EVENT_ID_HEADER)
        if not self.name:
            object.__setattr__(self, "name", f"{self.schema}.{self.table}")
