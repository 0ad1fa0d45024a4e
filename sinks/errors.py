"""The sink half's errors: the kafka_rc source's (KAFKA_RC_*) and the PostgreSQL sink's (SINK_*).

Each condition is a code, the class it is raised as and its message template
(outbox/core/errors.py says how codes and templates are used); a raise is
`raise error("CODE", field=value)`. SinkError, the class of a batch the sink
refused, is here too.
"""

from __future__ import annotations

import re

from outbox.core.errors import (
    CORE,
    Condition,
    Conditions,
    ConfigError,
    DataLossError,
    ExtraMissing,
    OutboxError,
    ServiceUnavailable,
)


class SinkError(OutboxError):
    """A batch the sink refused to apply. Nothing of it was committed, except, when applied in
    the tasks, other tasks' topic-partitions, which the batch's replay then skips."""


# What ends each of the source's losses (ranges.reconcile) when it stops the query.
KAFKA_RC_LOSS_ADVICE = (
    "; records may have been lost. To go on with the records still there,"
    " set the source option failOnDataLoss=false"
)

CONDITIONS = Conditions(
    CORE,
    SINK_SPARK_MISSING=Condition(
        ExtraMissing,
        "the sinks and kafka_rc run in Spark, and PySpark is not installed here:"
        " pip install 'outbox-eos[spark]' (the relay and the outbox commands need no Spark)",
    ),
    # -- kafka_rc options (sinks/kafka_source/options.py) ----------------------------------------------
    KAFKA_RC_OPTION_UNSUPPORTED=Condition(ConfigError, "option {option!r} is not supported: {why}"),
    KAFKA_RC_OPTION_UNKNOWN=Condition(
        ConfigError, "unknown option(s) {options}: kafka client settings take a 'kafka.' prefix"
    ),
    KAFKA_RC_BOOTSTRAP_MISSING=Condition(ConfigError, "option kafka.bootstrap.servers is required"),
    KAFKA_RC_ISOLATION_LEVEL_SET=Condition(
        ConfigError,
        "set no kafka.isolation.level: the source reads read_committed; to read records of"
        " aborted and open transactions too, set {opt_in}=true",
    ),
    KAFKA_RC_SUBSCRIPTION_NOT_ONE=Condition(
        ConfigError, "give exactly one of the options subscribe or subscribePattern"
    ),
    KAFKA_RC_SUBSCRIBE_EMPTY=Condition(ConfigError, "option subscribe names no topic"),
    KAFKA_RC_PATTERN_INVALID=Condition(ConfigError, "option subscribePattern is not a valid regex: {reason}"),
    KAFKA_RC_LEDGER_SINK_MISSING=Condition(
        ConfigError, "options ledger.url / ledger.schema need ledger.sink, the sink's name"
    ),
    KAFKA_RC_OFFSETS_INVALID=Condition(
        ConfigError,
        "option {option}: {why}; give earliest, latest or JSON like"
        ' {{"topic":{{"0":23,"1":-2}}}} (-2 earliest, -1 latest), got {value!r}',
    ),
    KAFKA_RC_OFFSETS_TOPIC_NOT_READ=Condition(
        ConfigError, "option {option} names topics {topics}, which the query does not read ({subscription})"
    ),
    # -- kafka_rc ranges (sinks/kafka_source/ranges.py): offsets given, offsets lost --------------------
    KAFKA_RC_OFFSETS_END_BEFORE_START=Condition(
        ConfigError, "option endingOffsets ends before startingOffsets starts: {partitions}"
    ),
    KAFKA_RC_OFFSETS_INCOMPLETE=Condition(
        ConfigError, "option {option} gives no offset for {partitions}: list every partition"
    ),
    KAFKA_RC_TOPIC_RECREATED=Condition(
        DataLossError,
        "topic {topic} was deleted and created again (topic id {was}, now {now}):"
        " the offsets read so far are of the old topic" + KAFKA_RC_LOSS_ADVICE,
    ),
    KAFKA_RC_LOG_TRUNCATED=Condition(
        DataLossError,
        "{topic}-{partition} now ends at offset {end}, before offset {offset} already read:"
        " its log was truncated, or the topic created again" + KAFKA_RC_LOSS_ADVICE,
    ),
    KAFKA_RC_OFFSETS_DELETED=Condition(
        DataLossError,
        "offsets {first}-{last} of {topic}-{partition} were deleted before they"
        " were read (retention?)" + KAFKA_RC_LOSS_ADVICE,
    ),
    # -- kafka_rc cluster (sinks/kafka_source/cluster.py): the driver's questions to Kafka -------------
    KAFKA_RC_TOPIC_MISSING=Condition(
        ConfigError, "topic(s) {topics} do not exist on {servers} (deleted, or never created)"
    ),
    KAFKA_RC_REQUEST_FAILED=Condition(ServiceUnavailable, "cannot {doing} on {servers}: {reason}"),
    KAFKA_RC_CLUSTER_UNAVAILABLE=Condition(
        ServiceUnavailable,
        "cannot {doing} on {servers}: {reason}, for {seconds:.0f}s (option unavailableTimeoutMs)",
    ),
    # -- kafka_rc reader (sinks/kafka_source/reader.py): a task reading one range ----------------------
    KAFKA_RC_READ_STALLED=Condition(
        ServiceUnavailable,
        "{topic}-{partition}: no progress at offset {offset} (reading up to {end})"
        " for {seconds:.0f}s; is the broker reachable? (option {option})",
    ),
    KAFKA_RC_OFFSET_GONE=Condition(
        DataLossError,
        "{topic}-{partition}: offset {offset} is no longer on the broker"
        " (removed by retention?); set failOnDataLoss=false to skip what is gone",
    ),
    KAFKA_RC_READ_FAILED=Condition(ServiceUnavailable, "{topic}-{partition}: {reason}"),
    # -- kafka_rc source (sinks/kafka_source/source.py): a checkpoint's topics -------------------------
    KAFKA_RC_CHECKPOINT_OTHER_SUBSCRIPTION=Condition(
        ConfigError,
        "the checkpoint holds offsets of topic(s) {topics}, which this query does not"
        " subscribe to ({subscription}): the checkpoint belongs to another subscription;"
        " give this query a new checkpointLocation",
    ),
    KAFKA_RC_TOPIC_DELETED=Condition(
        ConfigError, "topic(s) {topics} were deleted while the query was reading them"
    ),
    # -- ledger (sinks/ledger.py) ----------------------------------------------------------------------
    SINK_TOPIC_RECREATED=Condition(
        DataLossError,
        "topic {topic} was deleted and created again since sink {sink} applied it (topic id"
        " {was}, now {now}): the sink's ledger holds offsets of the old topic, which would skip the"
        " new topic's records. To apply the new topic from its start, set the source option"
        " failOnDataLoss=false (the sink then forgets the old topic's offsets, and says so)",
    ),
    # -- sink spec (sinks/postgres/spec.py) ------------------------------------------------------------
    SINK_TABLE_UNNAMED=Condition(ConfigError, "the sink needs a table name"),
    SINK_ROUTES_EMPTY=Condition(
        ConfigError, "a routed sink needs at least one table: tables={{value: Table(...)}}"
    ),
    SINK_ROUTED_UNNAMED=Condition(
        ConfigError, "a routed sink needs name=..., what its ledger keys the offsets of all its tables by"
    ),
    SINK_UNROUTED_NOT_A_CHOICE=Condition(ConfigError, "unrouted must be one of {choices}, got {got!r}"),
    SINK_ROUTED_TABLE_REPEATS=Condition(
        ConfigError,
        "route values {values} both go to table {table}: route by a Column that gives them one value"
        " (F.when(...)), and map that value once",
    ),
    SINK_ROUTE_NEEDS_COLUMNS=Condition(
        ConfigError,
        "table {table}: create or evolve on a routed sink needs columns=[...], the frame's fields that"
        " table takes (the frame carries every route's fields)",
    ),
    SINK_ROUTE_COLUMN_ABSENT=Condition(
        ConfigError, "the route column {by!r} is not in the frame (columns: {columns})"
    ),
    SINK_ROUTED_COLUMNS_ABSENT=Condition(
        ConfigError, "table {table}: columns {columns} are not fields of the frame (fields: {fields})"
    ),
    SINK_KEY_MISSING=Condition(ConfigError, "the sink needs at least one key column (default: event_id)"),
    SINK_KEY_REPEATS=Condition(ConfigError, "key columns repeat: {key}"),
    SINK_VERSION_IS_KEY=Condition(ConfigError, "the version column {version!r} cannot also be a key column"),
    SINK_VERSION_NEEDS_UPSERT=Condition(
        ConfigError, "a version column needs mode='upsert': mode='insert' never replaces a row"
    ),
    SINK_OUTBOX_TOPIC_MISSING=Condition(ConfigError, "Outbox needs a topic"),
    SINK_OUTBOX_HEADER_RESERVED=Condition(
        ConfigError,
        "Outbox header {name!r} is the relay's own: it stamps every record with the event's id there;"
        " name yours otherwise",
    ),
    # -- parse_json (sinks/postgres/parse.py) ----------------------------------------------------------
    SINK_SCHEMA_FIELDS_CLASH=Condition(
        ConfigError, "schema fields {fields} clash with the Kafka columns of the same name; rename them"
    ),
    SINK_KEY_COLUMN_NOT_IN_SCHEMA=Condition(
        ConfigError, "key_column {key_column!r} is not a field of the schema {schema}"
    ),
    SINK_KEY_FORMAT_UNKNOWN=Condition(
        ConfigError,
        "key_format {key_format!r}: give {formats}, how a tombstone's Kafka key is written",
    ),
    # -- parse_avro, parse_protobuf (sinks/postgres/parse.py) ------------------------------------------
    SINK_FORMAT_MISSING=Condition(
        ConfigError,
        "{what} needs {needs} and Confluent's registry client: pip install 'outbox-eos[registry]'",
    ),
    SINK_REGISTRY_SUBJECT_NEEDED=Condition(
        ConfigError,
        "{what} needs to know its reader: give subject= (its newest schema is read) or, for Avro,"
        " schema=; or read one topic by name (option subscribe) for its '<topic>-value' subject",
    ),
    SINK_REGISTRY_SUBJECT_UNKNOWN=Condition(
        ConfigError, "subject {subject!r} is not registered at {registry}: register it, or name another"
    ),
    SINK_READER_SCHEMA_INVALID=Condition(
        ConfigError, "the reader schema is not a {kind} schema read here: {reason}"
    ),
    SINK_AVRO_SCHEMA_NOT_RECORD=Condition(
        ConfigError, "the reader schema is a {type}, not a record: its fields are the frame's columns"
    ),
    # -- catalog (sinks/postgres/catalog.py) -----------------------------------------------------------
    SINK_TABLE_NOT_FOUND=Condition(
        ConfigError,
        "table {schema}.{table} does not exist in {database}: create it (with a unique"
        " index on the key columns) before starting the sink, or pass create=True",
    ),
    # -- plan (sinks/postgres/plan.py): the frame against the table ------------------------------------
    SINK_COLUMNS_NOT_IN_TABLE=Condition(
        ConfigError,
        "DataFrame columns {columns} are not in table {table} (columns: {table_columns});"
        " drop or rename them before the sink",
    ),
    SINK_COLUMNS_GENERATED=Condition(
        ConfigError, "columns {columns} of table {table} are generated and cannot be written; drop them"
    ),
    SINK_REQUIRED_COLUMNS_MISSING=Condition(
        ConfigError, "table {table} needs columns {columns} (NOT NULL, no default) that the DataFrame lacks"
    ),
    SINK_KEY_COLUMNS_ABSENT=Condition(
        ConfigError, "key columns {columns} are not both in the DataFrame and in table {table}"
    ),
    SINK_NO_UNIQUE_INDEX=Condition(
        ConfigError,
        "table {table} has no unique index on exactly {key} that ON CONFLICT can use (a deferrable"
        " one, or one left invalid, is none): the sink upserts ON CONFLICT over the key; add one,"
        " e.g. CREATE UNIQUE INDEX ON {name} ({columns})",
    ),
    SINK_VERSION_COLUMN_ABSENT=Condition(
        ConfigError, "version column {version!r} is not both in the DataFrame and in table {table}"
    ),
    SINK_VERSION_NOT_ORDERED=Condition(
        ConfigError,
        "version column {version!r} is {type}; it must be a number"
        " or a timestamp so versions can be compared",
    ),
    SINK_POSITION_COLUMNS_MISSING=Condition(
        ConfigError,
        "the DataFrame needs the Kafka position columns topic (string), partition (int) and offset"
        " (long) to apply each event exactly once; missing or mistyped: {columns}. Keep them when you"
        " parse the value, or use sinks.postgres.parse_json",
    ),
    SINK_FIELD_TYPE_UNMAPPED=Condition(
        ConfigError,
        "create/evolve: a Spark {spark_type} has no column type of its own; cast it in the DataFrame first",
    ),
    SINK_COLUMN_NO_LONGER_FITS=Condition(
        ConfigError,
        "{table}.{column} is {type}, and the frame's {column} is now a Spark {spark_type}: some of its"
        " values may not fit, and the sink never narrows nor changes a column itself. To take them: {alter}",
    ),
    SINK_AVRO_WRITER_UNREADABLE=Condition(
        ConfigError,
        "no record of writer schema id {schema_id} can be read as the reader schema: the reader's"
        " {fields} has no default, and that writer has no such field (a schema change, not a bad"
        " record; nothing of it was applied or dead-lettered). Give the field a default in the reader"
        " (its next version, or parse_avro's schema=), or read with a reader without it, and start"
        " the query again",
    ),
    SINK_TABLE_LOCKED=Condition(
        OutboxError,
        "create/evolve waited {seconds:g}s for {table}, which another transaction holds, and changed"
        " nothing (its ALTER TABLE would hold up every write to the table meanwhile): start the query"
        " again when that transaction has ended (pg_stat_activity names it)",
    ),
    SINK_COLUMN_TYPE_MISMATCH=Condition(
        ConfigError,
        "column {column!r}: a Spark {spark_type} cannot be written to {table}.{column}"
        " of type {type}; cast it in the DataFrame first",
    ),
    SINK_ISOLATION_UNSET=Condition(
        ConfigError,
        "Spark's kafka source reads the records of aborted and open transactions unless told, and"
        " the sink would apply them: set .option('kafka.isolation.level', 'read_committed')",
    ),
    SINK_LEDGER_OTHER_SINK=Condition(
        ConfigError,
        "kafka_rc starts from the ledger of sink {source!r} in schema {source_schema!r}, but this sink"
        " keeps its own as {sink!r} in {schema!r}: after a lost checkpoint the query would start where"
        " that one stands (with no rows under the name, at startingOffsets) and skip or repeat events."
        " Set .option('ledger.sink', {sink!r}) and .option('ledger.schema', {schema!r}) (a sink"
        " renamed or moved keeps its old ledger with PostgresSink(..., name=...))",
    ),
    SINK_LEDGER_OTHER_DATABASE=Condition(
        ConfigError,
        "kafka_rc starts from the ledger in {ledger} ({there}), but this sink keeps its own in {url}"
        " ({here}): after a lost checkpoint the query would start where that ledger stands (with no"
        " rows there, at startingOffsets) and skip or repeat events. Set .option('ledger.url') to the"
        " database this sink writes to",
    ),
    # -- placement (sinks/postgres/placement.py) -------------------------------------------------------
    SINK_TASKS_UNPROVEN=Condition(
        ConfigError,
        "apply_in='tasks' needs each topic-partition's rows of a batch in one Spark task,"
        " but {why}; use apply_in='auto' to apply such frames on the driver,"
        " or repartition by topic and partition",
    ),
    # -- metrics (sinks/postgres/metrics.py) -----------------------------------------------------------
    SINK_METRICS_ADDRESS_INVALID=Condition(ConfigError, "metrics address must be HOST:PORT, got {address!r}"),
    SINK_METRICS_CANNOT_SERVE=Condition(
        ConfigError, "cannot serve the sink's metrics on {address}: {reason}"
    ),
    # -- the sink's lock (sinks/postgres/session.py) ---------------------------------------------------
    SINK_IN_USE=Condition(
        SinkError,
        "sink {sink} is being written by another query right now (it holds the sink's"
        " advisory lock); stop that query, or give this sink another name",
    ),
    # -- continuity (sinks/postgres/continuity.py) -----------------------------------------------------
    SINK_BATCH_LOST=Condition(
        SinkError,
        "sink {sink}: PostgreSQL no longer holds {which}, which Spark's checkpoint counts as applied"
        " (it went back in time: a failover to an asynchronous replica, a restore, or a crash without"
        " fsync); nothing of batch {batch} was applied. To read the lost events again, restart the query"
        " with a new checkpointLocation and kafka_rc's option ledger.sink={sink}, which starts where the"
        " ledger stands, or with startingOffsets='{offsets}'{moved}",
    ),
    SINK_TASK_COMMIT_LOST=Condition(
        ServiceUnavailable,
        "sink {sink}, batch {batch}: PostgreSQL no longer holds the commit of {partitions} (a crash without"
        " fsync or a failover to an asynchronous replica under the batch); applying the batch again",
    ),
    # -- topics (sinks/postgres/topics.py): the ledger against Kafka -----------------------------------
    SINK_LOG_TRUNCATED=Condition(
        DataLossError,
        "{topic}-{partition} now ends at offset {end}, but sink {sink} has applied it up to offset"
        " {offset}: the log was truncated (an unclean leader election?), and records written"
        " again at those offsets would be skipped. To apply them, set the source option failOnDataLoss=false"
        " (the sink then moves that partition's offset back to the log's end, and says so)",
    ),
    # -- apply (sinks/postgres/apply.py): a batch applied on the driver or in a task -------------------
    SINK_STAGE_INCOMPLETE=Condition(
        SinkError,
        "sink {sink}: the stage table holds {present} of {staged} staged rows (was"
        " PostgreSQL restarted?); nothing was applied, the batch replays when the query restarts",
    ),
    SINK_VALUE_UNPARSED=Condition(
        SinkError, "sink {sink}: cannot write {topic}[{partition}]@{offset}: {reason}"
    ),
    SINK_ROW_REFUSED=Condition(SinkError, "sink {sink}: the table refused a row: {reason}"),
)
error = CONDITIONS.error

# The last line of a Python traceback that raised one of these: `module.Class: [CODE] message`.
_RAISED = re.compile(r"^[\w.]+: \[([A-Z][A-Z0-9_]*)\] (.+)$", re.M)


def raised_in_tasks(exc: BaseException) -> OutboxError | None:
    """The condition one of the query's Python workers raised, which reaches the driver inside
    Spark's error, its traceback and the task's around it: the first one named there, again, to
    stop the query in its own line; None when Spark's error holds none."""
    for found in _RAISED.finditer(str(exc)):
        code, message = found.groups()
        if code in CONDITIONS:  # the base's codes too
            return CONDITIONS[code].kind(message.strip(), code=code)
    return None
