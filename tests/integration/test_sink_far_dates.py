"""Dates and times of every year PostgreSQL holds reach it as sent: year 0 and before are BC to
PostgreSQL (ISO's year 0 is 1 BC), and years past 9999 are its own too."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from outbox.core.config import DatabaseUrl
from sinks.postgres import PostgresSink
from tests.sink_support import apply_batches

pytestmark = pytest.mark.timeout(300)

# As sent (Spark's ISO text, its years as Spark writes them), and as PostgreSQL prints them back.
DAYS = [
    ("0001-01-01", "0001-01-01"),
    ("0000-06-15", "0001-06-15 BC"),
    ("-0044-03-15", "0045-03-15 BC"),
    ("+10000-01-01", "10000-01-01"),
]


@pytest.mark.parametrize("tasks", [True, False], ids=["in-tasks", "on-driver"])
def test_dates_and_times_of_any_year_postgresql_holds_are_applied_not_dead_lettered(  # type: ignore[no-untyped-def]
    spark, outbox_db: DatabaseUrl, pg: psycopg.Connection, tasks
) -> None:
    pg.execute("CREATE TABLE days (event_id uuid PRIMARY KEY, day date, at timestamp, at_utc timestamptz)")
    pg.execute("SET TIME ZONE 'UTC'")
    sent = {}
    batch = []
    for text, _ in DAYS:
        event_id = str(uuid.uuid4())
        body = {
            "event_id": event_id,
            "day": text,
            "at": f"{text}T12:34:56.5",
            "at_utc": f"{text}T12:34:56.5Z",
        }
        sent[event_id] = text
        batch.append((event_id.encode(), json.dumps(body).encode()))
    schema = "event_id string, day date, at timestamp_ntz, at_utc timestamp"
    apply_batches(spark, PostgresSink("days", url=outbox_db.raw), [batch], schema, tasks)

    dead = pg.execute("SELECT error FROM sink_dead_letters").fetchall()
    assert dead == [], dead
    rows = dict(
        pg.execute(
            "SELECT event_id::text, day::text || '|' || at::text || '|' || at_utc::text FROM days"
        ).fetchall()
    )
    expected = {
        event_id: f"{pg_day}|{pg_day.replace(' BC', '')} 12:34:56.5{' BC' if 'BC' in pg_day else ''}"
        f"|{pg_day.replace(' BC', '')} 12:34:56.5+00{' BC' if 'BC' in pg_day else ''}"
        for event_id, (text, pg_day) in zip(sent, DAYS, strict=True)
    }
    assert rows == expected
