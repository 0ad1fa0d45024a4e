"""The outbox half's errors: the relay, add_event(s), `outbox` commands (db, relay, relays, trace,
verify, status, check).

Each condition is a code, the error class it raises and its message template
(str.format fields, given by name at the raise: `error("RELAY_NAME_INVALID", name=name)`).
The code is stable: code and tests match it; the words may change. The relay's
poison row (outbox.relay.poison.Poison) has its own class, with code RELAY_POISON.
"""

from __future__ import annotations

from outbox.core.errors import (
    CORE,
    Condition,
    Conditions,
    ConfigError,
    Fenced,
    NotReady,
    OutboxError,
    ServiceUnavailable,
    Standby,
)

CONDITIONS = Conditions(
    CORE,
    # writer: add_event(s) and the outbox table
    OUTBOX_EVENT_TOPIC_MISSING=Condition(OutboxError, "an outbox event needs a topic"),
    OUTBOX_EVENT_TOPIC_NOT_TEXT=Condition(
        OutboxError, "an outbox event's topic is text, the topic's name; got a value of type {given}{hint}"
    ),
    OUTBOX_EVENT_TOPIC_INVALID=Condition(
        OutboxError,
        "{topic!r} is no name Kafka takes for a topic: give 1 to 249 ASCII letters, digits,"
        " '.', '_' or '-' (not '.' or '..')",
    ),
    OUTBOX_EVENT_ID_INVALID=Condition(OutboxError, "the event id {event_id!r} is not a UUID"),
    OUTBOX_HEADER_NAME_NOT_STR=Condition(OutboxError, "header names must be str, not {kind}"),
    OUTBOX_HEADER_NAME_INVALID=Condition(
        OutboxError, "the header name {name!r} has a NUL or a lone surrogate: PostgreSQL text holds neither"
    ),
    OUTBOX_HEADER_RESERVED=Condition(
        OutboxError,
        "the header {name!r} is the relay's own: it stamps every record with the event's id there;"
        " name yours otherwise",
    ),
    OUTBOX_REGISTRY_MISSING=Condition(
        ConfigError, "an Avro or Protobuf value needs a schema registry: pass registry= or set {env}"
    ),
    OUTBOX_SCHEMA_REFUSED=Condition(
        OutboxError,
        "the schema registry at {registry} refused the schema under subject {subject!r}: {reason};"
        " nothing was written, and the transaction goes on",
    ),
    OUTBOX_REGISTRY_UNAVAILABLE=Condition(
        ServiceUnavailable,
        "the schema registry at {registry} does not answer ({reason}); nothing was written, and the"
        " transaction goes on",
    ),
    OUTBOX_VALUE_NOT_ENCODABLE=Condition(
        OutboxError, "the event value does not encode as {kind} of {name}: {reason}"
    ),
    OUTBOX_FIELD_NOT_BYTES=Condition(OutboxError, "the {what} must be bytes or str, not {kind}"),
    OUTBOX_FIELD_NOT_UTF8=Condition(
        OutboxError, "the {what} is a str with a lone surrogate, which UTF-8 cannot encode: pass bytes"
    ),
    OUTBOX_VALUE_NOT_SERIALISABLE=Condition(
        OutboxError, "the event value is neither bytes, str nor JSON-serialisable: {reason}"
    ),
    OUTBOX_NO_TRANSACTION=Condition(
        OutboxError,
        "add_event needs an open transaction (this connection is in autocommit mode): {how}"
        " so the event commits with your change",
    ),
    OUTBOX_CONNECTION_UNSUPPORTED=Condition(
        OutboxError, "add_event takes a psycopg Connection or a SQLAlchemy Connection/Session, not {kind}"
    ),
    OUTBOX_DRIVER_NOT_PSYCOPG=Condition(
        OutboxError,
        "add_event needs SQLAlchemy's psycopg 3 driver: use a postgresql+psycopg:// URL"
        " (this engine uses {module})",
    ),
    # relay settings: flags, -X settings, the metrics address
    RELAY_NAME_REQUIRED=Condition(
        ConfigError, "--name is required (or env OUTBOX_RELAY_NAME): it identifies the relay's position"
    ),
    RELAY_NAME_INVALID=Condition(
        ConfigError,
        "relay name {name!r} cannot be used: give printable characters, no '/', no space at either end",
    ),
    RELAY_SHARD_MALFORMED=Condition(ConfigError, "--shard must look like I/N (e.g. 0/4), got {text!r}"),
    RELAY_SHARD_OUT_OF_RANGE=Condition(
        ConfigError, "--shard {text}: need 0 <= I < N (shards are numbered from 0)"
    ),
    RELAY_KAFKA_CONFIG_UNREADABLE=Condition(ConfigError, "--kafka-config {file}: {reason}"),
    RELAY_CONFIG_UNREADABLE=Condition(ConfigError, "--config {file}: {reason}"),
    RELAY_CONFIG_KEY_UNKNOWN=Condition(
        ConfigError, "--config {file}: no setting {key!r} (keys are the flags' names without --)"
    ),
    RELAY_CONFIG_VALUE_INVALID=Condition(ConfigError, "--config {file}: {key}: {reason}"),
    RELAY_KAFKA_SETTING_MALFORMED=Condition(
        ConfigError, "{source}: expected KEY=VALUE, in a line starting {key!r}"
    ),
    RELAY_KAFKA_SETTING_RESERVED=Condition(
        ConfigError, "-X {setting} is set by the relay itself and cannot be overridden"
    ),
    RELAY_SYNCHRONOUS_COMMIT_INVALID=Condition(ConfigError, "synchronous_commit must be one of {choices}"),
    RELAY_METRICS_ADDRESS_MALFORMED=Condition(
        ConfigError, "--metrics-address must be HOST:PORT or off, got {address!r}"
    ),
    RELAY_METRICS_ADDRESS_UNAVAILABLE=Condition(
        ConfigError, "cannot serve metrics on {address}: {reason} (pick another --metrics-address, or off)"
    ),
    # relay at work: its database session, its Kafka producer, retries
    RELAY_STANDBY=Condition(Standby, "PostgreSQL at {url} is a standby (in recovery)"),
    RELAY_POOLED=Condition(
        ConfigError,
        "PostgreSQL at {url} is reached through a connection pooler (PgBouncer, RDS Proxy):"
        " one relay instance is active by holding a session's lock, which a pooler in transaction"
        " mode grants to every instance that borrows that session. Connect the relay to PostgreSQL"
        " directly",
    ),
    RELAY_NOT_CONNECTED=Condition(ServiceUnavailable, "not connected to PostgreSQL"),
    RELAY_OUTBOX_ID_MISSING=Condition(
        ConfigError,
        "{schema}.{table} in {url} is empty:"
        " run `outbox db upgrade --schema {schema}` (it adds the outbox's id)",
    ),
    RELAY_KAFKA_FAILED=Condition(ServiceUnavailable, "Kafka at {bootstrap}: {reason}"),
    RELAY_KAFKA_UNREACHABLE=Condition(ServiceUnavailable, "cannot reach Kafka at {bootstrap}: {cause}"),
    RELAY_DELIVERY_TIMEOUT=Condition(
        ServiceUnavailable, "Kafka at {bootstrap}: delivery did not finish in {timeout}s"
    ),
    RELAY_KAFKA_SETTING_REFUSED=Condition(
        ConfigError, "Kafka at {bootstrap} refuses the relay's {setting} (-X {setting}=...): {reason}"
    ),
    RELAY_KAFKA_NOT_AUTHORIZED=Condition(
        ConfigError,
        "Kafka at {bootstrap} refuses the relay ({reason}): it needs a grant {why}. Add it, then start"
        " the relay again: {command} (docs/relay.md lists every grant a relay needs)",
    ),
    RELAY_KAFKA_SETTING_INVALID=Condition(
        ConfigError,
        "the Kafka client (librdkafka) does not take the relay's settings: {reason} (-X, --kafka-config)",
    ),
    RELAY_NOT_PERMITTED=Condition(
        ConfigError,
        "PostgreSQL at {url} refuses the relay's role: {reason}. The relay needs SELECT on the"
        " outbox's tables, INSERT and UPDATE on relay_positions, INSERT on relay_dead_letters and"
        " DELETE on outbox_events (or --no-cleanup)",
    ),
    RELAY_FENCED=Condition(Fenced, "fenced: another instance with this relay name and shard took over"),
    RELAY_PUBLISHER_NOT_STARTED=Condition(OutboxError, "publisher not started"),
    RELAY_GAVE_UP=Condition(ServiceUnavailable, "giving up after {retries} retries: {reason}"),
    # positions: the relay's place in Kafka and in PostgreSQL, `outbox relays`
    RELAY_POSITION_UNREADABLE=Condition(OutboxError, "unreadable relay position record ({reason}): {data!r}"),
    RELAY_POSITION_SNAPSHOT_MALFORMED=Condition(
        OutboxError, "relay position holds a malformed snapshot {snapshot!r}"
    ),
    RELAY_POSITION_OTHER_OUTBOX=Condition(
        ConfigError,
        "the position record under {key!r} belongs to relay {recorded!r} of outbox {recorded_outbox},"
        " not to {relay!r} of outbox {outbox}: refusing to apply another outbox's position",
    ),
    RELAY_SHARD_COUNT_CHANGED=Condition(
        ConfigError,
        "relay {relay!r} already has positions for {count} shard(s) of this outbox, and this one was"
        " started as shard {shard}. Changing the shard count needs a new relay name (which republishes"
        " the rows still in the outbox table) or keeping the old count.",
    ),
    RELAY_POSITION_AHEAD=Condition(
        ConfigError,
        "the relay's position ({base}) is ahead of this database, whose next transaction id is {horizon}:"
        " restored from an older backup or another cluster? Run `{rebase}` to publish again every row"
        " left in the outbox",
    ),
    RELAY_POSITION_OTHER_CLUSTER=Condition(
        ConfigError,
        "this database is another PostgreSQL cluster (system identifier {system}) than the one the"
        " relay's position was read from ({stamped}): restored with pg_dump, upgraded with pg_upgrade,"
        " or a wrong DATABASE_URL? Transaction ids mean something else here. If this is now the"
        " outbox, stop every relay of it and run `{rebase}`",
    ),
    RELAY_POSITIONS_TOPIC_NOT_CREATED=Condition(
        ConfigError,
        "cannot create the relay positions topic {topic!r}: {reason} (create it yourself: compacted,"
        " 1 partition, {replicas} replicas)",
    ),
    RELAY_POSITIONS_TOPIC_NO_LEADER=Condition(
        ServiceUnavailable, "the positions topic {topic!r} has no leader {timeout:.0f}s after its creation"
    ),
    RELAY_POSITIONS_TOPIC_WAITING=Condition(
        NotReady,
        "the positions topic {topic!r} is to have {replicas} replicas, and {live} of the cluster's {brokers}"
        " brokers are up: waiting for them to create it (or create it yourself: compacted, 1 partition)",
    ),
    RELAY_POSITIONS_TOPIC_UNKNOWN=Condition(
        ServiceUnavailable, "the positions topic {topic!r} exists, but the broker asked does not know it yet"
    ),
    RELAY_REBASE_WHILE_RUNNING=Condition(
        ConfigError,
        "a relay of the outbox in schema {schema!r} is running: stop every relay of it, then rebase",
    ),
    RELAY_NOT_RECORDED=Condition(
        ConfigError, "no relay {relay!r} is recorded in schema {schema!r} (see `outbox relays list`)"
    ),
    RELAY_FORGET_WHILE_RUNNING=Condition(
        ConfigError, "relay {relay!r} is running: stop it before forgetting it"
    ),
    RELAY_REGISTRY_DATABASE_ERROR=Condition(OutboxError, "outbox relays {action} in {url}: {reason}"),
    # sinks: `outbox sinks adopt`
    SINKS_CHECKPOINT_UNREADABLE=Condition(
        ConfigError,
        "checkpoint {path}: {reason}; give --query and --batch instead (the id in its metadata file,"
        " the highest number in its commits/ folder)",
    ),
    SINKS_ADOPT_ARGUMENTS=Condition(ConfigError, "give --checkpoint DIR, or --query ID and --batch N"),
    SINKS_DATABASE_ERROR=Condition(OutboxError, "outbox sinks {action} in {url}: {reason}"),
    # adopt: `outbox db adopt-debezium`
    DB_DOWNGRADE_ADOPTED=Condition(
        ConfigError,
        "{tables} copy each inserted row into {schema}.outbox_events (outbox db adopt-debezium): without"
        " it their applications' inserts fail. Take each trigger away first (`{undo}`); nothing"
        " was dropped",
    ),
    ADOPT_TABLE_MISSING=Condition(
        ConfigError, "there is no table {table}: name the outbox table Debezium reads"
    ),
    ADOPT_COLUMN_MISSING=Condition(
        ConfigError, "{table} has no column {column!r} (the router's {option}): give --set {option}=COLUMN"
    ),
    ADOPT_COLUMN_TYPE=Condition(ConfigError, "{table}.{column} is of type {type}; it must be {needs}"),
    ADOPT_OPTION_UNSUPPORTED=Condition(
        ConfigError,
        "the EventRouter option {option!r} is not one adopt-debezium maps; it takes {supported}",
    ),
    ADOPT_OPTION_MALFORMED=Condition(ConfigError, "--set needs OPTION=VALUE, got {text!r}"),
    ADOPT_PLACEMENT_UNSUPPORTED=Condition(
        ConfigError,
        "table.fields.additional.placement {item!r}: only COLUMN:header[:ALIAS] is mapped"
        " (envelope and partition placements are not)",
    ),
    ADOPT_LOCK_TIMEOUT=Condition(
        OutboxError,
        "outbox db adopt-debezium waited {seconds:g}s for {table}, which another transaction holds,"
        " and changed nothing (its trigger's change would hold up every insert meanwhile): run it"
        " again when that transaction has ended (pg_stat_activity names it), or give --lock-timeout"
        " more seconds",
    ),
    ADOPT_DATABASE_ERROR=Condition(OutboxError, "outbox db adopt-debezium in {url}: {reason}"),
    # trace: `outbox trace`
    TRACE_EVENT_OR_PRUNE=Condition(ConfigError, "give an EVENT_ID to trace, or --prune DAYS (not both)"),
    TRACE_PRUNE_DAYS_INVALID=Condition(ConfigError, "--prune needs a number of days >= 0, got {days:g}"),
    TRACE_AT_MALFORMED=Condition(
        ConfigError, "--at needs TOPIC:PARTITION:OFFSET (like orders:0:42), got {text!r}"
    ),
    TRACE_DATABASE_ERROR=Condition(OutboxError, "outbox trace in {url}: {reason}"),
    # verify: `outbox verify`
    VERIFY_FROM_OFFSETS_MALFORMED=Condition(
        ConfigError, '--from-offsets must be JSON like {{"0": 42, "1": 7}}, no number below 0, got {text!r}'
    ),
    VERIFY_SOURCE_SQL_FAILED=Condition(ConfigError, "--source-sql failed: {reason}"),
    VERIFY_FLAG_EMPTY=Condition(ConfigError, "{flag} is empty: give it, or leave the flag out"),
    VERIFY_SOURCE_IS_TOPIC=Condition(
        ConfigError,
        "--source-topic names the topic checked ({topic}): no event could be found missing;"
        " name the topic the events came from",
    ),
    VERIFY_FROM_OFFSETS_WITH_SOURCE=Condition(
        ConfigError,
        "--from-offsets checks part of the topic, a source names every event: every event before the"
        " offsets would be missing. Leave one out",
    ),
    # status: `outbox status`
    STATUS_DATABASE_ERROR=Condition(OutboxError, "outbox status in {url}: {reason}"),
    # migrations: `outbox db`, `outbox check`
    DB_DOWNGRADE_SQL_NEEDS_RANGE=Condition(
        OutboxError, "downgrade --sql needs a range FROM:TO, e.g. 0001:base"
    ),
    DB_DOWNGRADE_WOULD_DROP_ROWS=Condition(
        OutboxError,
        "the downgrade drops {table}, which holds rows (events not yet published, a ledger, positions"
        " or dead letters): nothing was dropped; keep a copy, then run it again with --force",
    ),
    DB_MIGRATION_FAILED=Condition(OutboxError, "migration failed: {reason}"),
    DB_REVISION_UNREADABLE=Condition(
        OutboxError, "cannot read the applied revision in schema {schema!r}: {reason}"
    ),
    DB_LOCK_TIMEOUT=Condition(
        OutboxError,
        "a migration in schema {schema!r} waited {seconds:g}s for a table another transaction holds,"
        " and nothing was changed (a table it alters would hold up every write to it meanwhile):"
        " run it again when that transaction has ended (pg_stat_activity names it), or give"
        " --lock-timeout more seconds",
    ),
    DB_REVISION_FAILED=Condition(
        OutboxError, "migration to {revision} failed in schema {schema!r}: {reason}"
    ),
    DB_NOT_AT_HEAD=Condition(
        OutboxError, "schema {schema!r} is at {current}, head is {head}: run `outbox db upgrade`"
    ),
    DB_TXID_TRIGGER_DISABLED=Condition(
        OutboxError,
        "trigger {trigger} on {table} is disabled: a row whose INSERT sets txid, or that logical"
        " replication brings, is taken for published and never sent; run {fix}",
    ),
)

error = CONDITIONS.error
