"""PostgresSink's keywords, each declared once (outbox.core.settings.Setting).

PostgresSink's defaults and SinkSpec's checks come from `SETTINGS`, and
docs/sink.md's options table and PostgresSink's docstring are checked against
them. They are Python values, never parsed from text: a bad one is one line
with a shared code (SETTING_NOT_A_CHOICE, SETTING_NOT_POSITIVE). The types of the
keywords' values (Mode, OnError, Outbox) live here too, so spec.py reads this module and
this module reads nothing of the sink's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from outbox.core.settings import Setting
from sinks.postgres.placement import ApplyIn

T = TypeVar("T")

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


def _never_text(text: str) -> Any:
    raise ValueError(text)


def _keyword(name: str, default: T, doc: str, **checks: Any) -> Setting[T]:
    return Setting(name, default, doc, _never_text, called=f"PostgresSink's {name}", **checks)


URL: Setting[str | None] = _keyword("url", None, "PostgreSQL URL (default: `DATABASE_URL`)")
SCHEMA = _keyword("schema", "public", "the table's schema")
KEY = _keyword("key", "event_id", "column or columns backed by a unique index: an event's identity")
MODE: Setting[Mode] = _keyword(
    "mode",
    "upsert",
    '`"upsert"` (`ON CONFLICT DO UPDATE`, latest position wins) or `"insert"` (`DO NOTHING`, first wins)',
    choices=("upsert", "insert"),
)
VERSION: Setting[str | None] = _keyword(
    "version",
    None,
    "a numeric or timestamp column: a row is never replaced by an older version, and a stale record"
    " is counted apart from a duplicate (see the ordering rule)",
)
DELETE: Setting[Literal["tombstone"] | str | None] = _keyword(
    "delete",
    "tombstone",
    'records that delete their key: `"tombstone"` (null Kafka value), a SQL boolean expression,'
    " a Column, or `None`",
)
ON_ERROR: Setting[OnError] = _keyword(
    "on_error",
    "dead_letter",
    '`"dead_letter"`: rows that cannot be written go to `sink_dead_letters` and the batch goes on;'
    ' `"fail"`: the batch fails with the row\'s position and error, and nothing of it is applied'
    " (in the tasks: nothing of the refused task's topic-partitions; the others' commits are"
    " skipped by the replay)",
    choices=("dead_letter", "fail"),
)
OUTBOX: Setting[Outbox | None] = _keyword(
    "outbox",
    None,
    "`Outbox(topic, key=SQL, value=SQL, headers={name: SQL})`: one outbox event per changed row,"
    " in the same transaction",
)
NAME: Setting[str | None] = _keyword(
    "name", None, "what the ledger keys this sink's offsets by (default: `schema.table`)"
)
LEDGER_SCHEMA: Setting[str | None] = _keyword(
    "ledger_schema", None, "the schema of the framework's tables (default: `OUTBOX_SCHEMA`, else public)"
)
APPLY_IN: Setting[ApplyIn] = _keyword(
    "apply_in",
    "auto",
    '`"auto"`: in the tasks when the frame allows it, else staged; `"tasks"`: in the tasks, or'
    ' refused at start; `"driver"`: always staged',
    choices=("auto", "tasks", "driver"),
)
KAFKA: Setting[Mapping[str, str] | None] = _keyword(
    "kafka",
    None,
    "librdkafka settings added to those the sink asks Kafka for topic ids with (credentials, where"
    " Spark's source has Java ones; default: the frame's source's settings)",
)
DATABASE_TIMEOUT = _keyword(
    "database_timeout",
    30.0,
    "seconds: how often a task checks that PostgreSQL still works for its transaction, and the base"
    " of the limits that follow from it (see the partition bullet above)",
    positive=True,
)
TRACE = _keyword(
    "trace",
    False,
    "record what each applying statement did with its records in `sink_traces`, for"
    " `outbox trace EVENT_ID` (one row per statement, no index; what it costs is measured in"
    " [Benchmarks](benchmarks.md#the-sink)); the outbox events then take ids a trace can compute",
)
CREATE = _keyword(
    "create",
    False,
    "make the table when it is missing: a column per field of the frame (Kafka's own columns"
    " aside), the key its primary key",
)
EVOLVE = _keyword(
    "evolve",
    False,
    "add a nullable column for each field the table lacks, before the first batch; a field whose"
    " type no longer fits its column stops the query, naming the ALTER TABLE that would take it",
)
READ_KAFKA = _keyword(
    "read_kafka",
    True,
    "where the frame is `parse_json`, `parse_avro` or `parse_protobuf` over a Kafka source and is"
    " applied in the tasks, the tasks read each batch's records from Kafka themselves and parse them."
    " JSON is parsed with Arrow, except in a range that Arrow could parse differently from Spark,"
    " which takes Spark's rows instead; Avro and Protobuf are parsed with the frame's own decoder."
    " Spark's progress then counts no input rows. With `False`, the tasks always take Spark's rows",
)
SETTINGS: tuple[Setting[Any], ...] = (
    KEY,
    MODE,
    VERSION,
    DELETE,
    ON_ERROR,
    APPLY_IN,
    OUTBOX,
    SCHEMA,
    NAME,
    URL,
    LEDGER_SCHEMA,
    KAFKA,
    DATABASE_TIMEOUT,
    TRACE,
    CREATE,
    EVOLVE,
    READ_KAFKA,
)
