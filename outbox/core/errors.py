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


class ExtraMissing(ConfigError, ImportError):
    """A part of the package imported without the extra it needs installed (an ImportError too)."""


class ServiceUnavailable(OutboxError):
    """PostgreSQL or Kafka could not be reached."""


class NotReady(ServiceUnavailable):
    """Reached, and not ready yet (a standby not yet promoted, brokers down while a topic is to be
    made): a daemon waits for it without counting a failure."""


class Standby(NotReady):
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
    """One half's error conditions, code -> Condition; `error(code, **fields)` makes one to raise.

    A half's table is built on the base's (`Conditions(CORE, ...)`): its `error` raises the
    shared codes too, and iterating it gives its own codes only.
    """

    def __init__(self, *bases: Conditions, **table: Condition) -> None:
        self._bases = bases
        self._table = table

    def __getitem__(self, code: str) -> Condition:
        if code in self._table:
            return self._table[code]
        for base in self._bases:
            if code in base:
                return base[code]
        raise KeyError(code)

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def error(self, code: str, /, **fields: object) -> OutboxError:
        condition = self[code]
        return condition.kind(condition.template.format(**fields), code=code)

    def message(self, code: str, /, **fields: object) -> str:
        """The words alone, for an error class of its own (one with more than a message)."""
        return self[code].template.format(**fields)


def merged(*halves: Mapping[str, Condition]) -> dict[str, Condition]:
    """Every half's conditions in one table; a code declared twice is a bug."""
    out: dict[str, Condition] = {}
    for half in halves:
        twice = out.keys() & half.keys()
        assert not twice, f"error codes declared twice: {sorted(twice)}"
        out.update(half)
    return out


_INSTALL_JAVA = (
    "install Java 17 or newer (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`;"
    " macOS: `brew install openjdk@17`) or point JAVA_HOME at one"
)
_UPGRADE = "run `outbox db upgrade --schema {schema}` first"

# The base's conditions: what both halves share (settings and URLs, reaching PostgreSQL and
# Kafka, the framework's tables, Java, the dev tools' plugins).
CORE = Conditions(
    # Settings and URLs (outbox/core/config.py); `url` is always the masked one.
    CONFIG_DATABASE_URL_MISSING=Condition(
        ConfigError,
        "{source} is not set: give a URL like postgresql://user:password@host:5432/dbname"
        ' (or run `eval "$(outbox dev up)"` for a local one)',
    ),
    CONFIG_DATABASE_URL_SCHEME=Condition(
        ConfigError, "{source} must start with postgresql:// (got {scheme!r}): {url}"
    ),
    CONFIG_DATABASE_URL_NO_HOST=Condition(ConfigError, "{source} names no host: {url}"),
    CONFIG_DATABASE_URL_HOST_INVALID=Condition(
        ConfigError,
        "{source} is malformed (host {host!r} is not host[:port]; several hosts are joined by ','): {url}",
    ),
    CONFIG_DATABASE_URL_NO_DATABASE=Condition(ConfigError, "{source} names no database (add /dbname): {url}"),
    CONFIG_DATABASE_URL_PARAMETER_UNKNOWN=Condition(
        ConfigError, "{source} is malformed (query parameter {key!r} is not a libpq setting): {url}"
    ),
    CONFIG_DATABASE_URL_UNENCODED=Condition(
        ConfigError,
        "{source} is malformed: its user, password or a setting holds a raw '@', '/', '%', '&', '=' or space;"
        " percent-encode it (@ as %40, / as %2F, % as %25, & as %26, = as %3D, space as %20): {url}",
    ),
    CONFIG_BOOTSTRAP_MISSING=Condition(
        ConfigError,
        "{source} is not set: give host:port[,host:port...]"
        ' (or run `eval "$(outbox dev up)"` for a local broker)',
    ),
    CONFIG_BOOTSTRAP_INVALID=Condition(
        ConfigError, "{source} entry {server!r} is not host:port (e.g. localhost:9092)"
    ),
    CONFIG_SECRET_FILE_UNREADABLE=Condition(
        ConfigError, "{variable} names {file}, which cannot be read ({reason}): mount the secret there"
    ),
    CONFIG_SECRET_FILE_EMPTY=Condition(
        ConfigError, "{variable} names {file}, which is empty: no secret in it"
    ),
    CONFIG_DATABASE_PASSWORD_TWICE=Condition(
        ConfigError,
        "{source} holds a password and DATABASE_PASSWORD_FILE names another: give the password one way",
    ),
    CONFIG_SCHEMA_INVALID=Condition(ConfigError, "schema name {name!r} is not a valid PostgreSQL identifier"),
    # A declared setting's value (outbox/core/settings.py): a flag, a variable, a Spark option.
    SETTING_MALFORMED=Condition(ConfigError, "{setting} must be {kind}, got {value!r}"),
    SETTING_NOT_POSITIVE=Condition(ConfigError, "{setting} must be positive, got {value!r}"),
    SETTING_NOT_FINITE=Condition(ConfigError, "{setting} must be a finite number, got {value!r}"),
    SETTING_OUT_OF_RANGE=Condition(
        ConfigError, "{setting} must be from {least:g} to {most:g}, got {value!r}"
    ),
    SETTING_NOT_A_CHOICE=Condition(ConfigError, "{setting} must be one of {choices}, got {value!r}"),
    # Reaching and using PostgreSQL (outbox/core/postgres.py).
    POSTGRES_STANDBY=Condition(
        ConfigError,
        "PostgreSQL at {url} is a read-only standby: the relay and the sink write to the primary;"
        " name it, or list every host with target_session_attrs=read-write",
    ),
    POSTGRES_POOLER_OPTIONS=Condition(
        ConfigError,
        "PostgreSQL at {url} is reached through a connection pooler that refuses libpq's options"
        " ({reason}); ours set the session's TimeZone. Set the pooler's ignore_startup_parameters ="
        " extra_float_digits,options (PgBouncer)",
    ),
    POSTGRES_UNREACHABLE=Condition(
        ServiceUnavailable,
        "cannot reach PostgreSQL at {url}: {reason}."
        " Check DATABASE_URL, or start a local server with `outbox dev up`.",
    ),
    POSTGRES_NO_ANSWER=Condition(
        ServiceUnavailable,
        "PostgreSQL at {url} did not answer {what} within {timeout:g}s; the connection was dropped",
    ),
    POSTGRES_SESSION_LOST=Condition(
        ServiceUnavailable, "PostgreSQL at {url} {cause}; the connection was dropped"
    ),
    # Reaching Kafka, reading a topic's committed records (probe.py, committed.py).
    KAFKA_UNREACHABLE=Condition(
        ServiceUnavailable,
        "cannot reach Kafka at {servers}: {reason}."
        " Check KAFKA_BOOTSTRAP_SERVERS, or start a local broker with `outbox dev up`.",
    ),
    KAFKA_READ_UNREACHABLE=Condition(ServiceUnavailable, "cannot reach Kafka at {servers}: {reason}"),
    KAFKA_READ_END_UNKNOWN=Condition(
        ServiceUnavailable,
        "cannot learn where {topic}-{partition} ends on {servers}, asked until the read's timeout: {reason}",
    ),
    KAFKA_TOPIC_MISSING=Condition(ConfigError, "topic {topic!r} does not exist on {servers}"),
    KAFKA_READ_TIMEOUT=Condition(
        ServiceUnavailable,
        "{topic} not read to its end in {timeout:.0f}s ({where}):"
        " a transaction still open, or Kafka slow to answer",
    ),
    KAFKA_READ_STUCK=Condition(ServiceUnavailable, "{stuck} ({where})"),  # the caller's words for the above
    KAFKA_READ_FAILED=Condition(ServiceUnavailable, "reading {topic} on {servers}: {reason}"),
    KAFKA_START_NO_PARTITION=Condition(
        ConfigError, "{topic} has no partition {partition} (it has {count}) to start reading at"
    ),
    KAFKA_START_OUTSIDE=Condition(
        ConfigError,
        "cannot start reading {topic} at offset {offset}: partition {partition} ends at offset {end}",
    ),
    KAFKA_START_GONE=Condition(
        DataLossError,
        "offset {offset} of partition {partition} is gone from {topic} (deleted by retention or"
        " delete-records): start at the partition's first offset, or leave it out to read from the start",
    ),
    # A schema registry's answers (outbox/core/registry.py); `registry` has no credentials.
    REGISTRY_REFUSED_CLIENT=Condition(
        ConfigError,
        "the schema registry at {registry} refused this client (HTTP {status}): check its credentials"
        " (basic.auth.user.info, bearer.auth.*) and what that user may read",
    ),
    REGISTRY_REFUSED_REQUEST=Condition(
        ConfigError,
        "the schema registry at {registry} refused the request (HTTP {status}): is the URL its"
        " Confluent-compatible API (for Apicurio, /apis/ccompat/v7)?",
    ),
    # The framework's tables (outbox/core/tables.py).
    TABLES_MISSING=Condition(ConfigError, "{noun} {listed} {verb} missing{where}: " + _UPGRADE + "{note}"),
    TABLES_OUTDATED=Condition(
        ConfigError,
        "{columns} {verb} missing in {url}: its tables are of an older revision; " + _UPGRADE,
    ),
    # Java (outbox/core/java.py).
    JAVA_HOME_INVALID=Condition(ConfigError, "JAVA_HOME={home} has no bin/java: " + _INSTALL_JAVA),
    JAVA_MISSING=Condition(
        ConfigError, "{needed_by} needs Java {minimum}+, and no `java` was found: " + _INSTALL_JAVA
    ),
    JAVA_VERSION_FAILED=Condition(ConfigError, "{java} -version failed ({reason}): " + _INSTALL_JAVA),
    JAVA_TOO_OLD=Condition(
        ConfigError, "{needed_by} needs Java {minimum}+, {java} is {found}: " + _INSTALL_JAVA
    ),
    # The dev tools' plugins (outbox/core/plugins.py).
    PLUGIN_COMMAND_MISSING=Condition(
        ConfigError, "`outbox {name}` ({what}) comes with the dev tools: {install}"
    ),
    PLUGIN_TOOL_MISSING=Condition(
        ConfigError, "{needed_by} runs {name}, which comes with the dev tools: {install}"
    ),
)
error = CORE.error
