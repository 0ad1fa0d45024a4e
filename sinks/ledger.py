"""The sink's progress ledger: the next Kafka offset to apply, per sink and topic-partition.

The sink advances it in the same PostgreSQL transaction as the rows it writes,
so the ledger, not Spark's checkpoint, is the truth about what was applied.
The source reads it to start a query whose checkpoint was lost exactly where
the table stands: nothing replayed, nothing skipped.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from outbox.config import DatabaseUrl
from outbox.errors import ConfigError, ServiceUnavailable
from outbox.sqltext import bindable

TABLE = "sink_progress"

Positions = dict[tuple[str, int], int]


def read_positions(url: DatabaseUrl, schema: str, sink: str) -> Positions:
    """Next offsets recorded for `sink`, per topic-partition."""
    query = bindable(
        sql.SQL("SELECT topic, kafka_partition, next_offset FROM {} WHERE sink = %s").format(
            sql.Identifier(schema, TABLE)
        )
    )
    try:
        with psycopg.connect(url.libpq, connect_timeout=10) as conn:
            rows = conn.execute(query, [sink]).fetchall()
    except psycopg.errors.UndefinedTable:
        raise ConfigError(
            f"no ledger table {schema}.{TABLE} in {url.safe}: run `outbox db upgrade --schema {schema}`"
        ) from None
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(
            f"cannot read the ledger at {url.safe}: {url.scrub(str(exc).strip())}"
        ) from None
    return {(t, p): o for t, p, o in rows}
