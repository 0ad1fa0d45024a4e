"""The ground floor both halves stand on: settings, errors, and the edges to PostgreSQL and Kafka.

Nothing here knows about the outbox or the sink; the rest of `outbox/` and
`sinks/` import from here, never from each other for these. Public: `sinks`
stands on it as the rest of `outbox` does, and its modules are its face
(`__all__`); the names an application needs are re-exported by `outbox` itself.

    config.py     settings from flags and env vars; URLs that never print their password
    errors.py     OutboxError and its kinds: what the CLI prints as one line; the base's error codes
    postgres.py   connect, and turn a driver failure into one scrubbed line
    tables.py     the framework's tables: names, the outbox's columns, the "run db upgrade" check
    kafka.py      client settings per role, librdkafka's log routed to logging
    sqltext.py    statements that name user objects and also take parameters
    probe.py      reach PostgreSQL and Kafka once, before real work starts
    committed.py  read a topic's committed records once, to its end as of now
    registry.py   schemas from a Confluent-compatible schema registry; wire.py its framing
"""

__all__ = [
    "committed",
    "config",
    "errors",
    "java",
    "kafka",
    "plugins",
    "postgres",
    "probe",
    "registry",
    "settings",
    "sqltext",
    "tables",
    "trace",
    "wire",
]
