"""`outbox status` against a known state: a stopped relay with rows waiting, a sink's ledger behind its
topic and held back by an open transaction, dead letters of both halves."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from outbox.core.config import DatabaseUrl
from outbox.core.kafka import client_settings
from outbox.writer import Event, add_events
from tests.cli import assert_one_line_error, outbox
from tests.helpers import create_topic, transactional_producer, unique, wait_for
from tests.relay_support import ACTIVE, outbox_rows, relay_job, terminate, wait_published


def _events(topic: str, count: int, key: str) -> list[Event]:
    return [Event(topic, {"n": n}, key) for n in range(count)]


def test_status_shows_what_waits_what_lags_and_what_was_dead_lettered(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, pg: psycopg.Connection
) -> None:
    out_topic = create_topic(bootstrap, unique("out"))
    in_topic = create_topic(bootstrap, unique("in"), partitions=2)
    relay = unique("relay")

    # A relay publishes three rows and stops; two more are written after it.
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, _events(out_topic, 3, "a"))
    job, _ = relay_job(tmp_path, env, relay)
    job.wait_for_output(ACTIVE, 60)
    wait_published(bootstrap, out_topic, 1, 3)
    wait_for(lambda: outbox_rows(outbox_db) == 0, 30, "cleanup of the published rows")
    assert terminate(job) == 0, job.output()
    with psycopg.connect(outbox_db.libpq) as conn:
        add_events(conn, _events(out_topic, 2, "b"))

    # The input topic: 5 records on partition 0, 2 on partition 1 and one more there in an open transaction.
    plain = Producer(client_settings({"bootstrap.servers": bootstrap}, "producer"))
    for partition, count in ((0, 5), (1, 2)):
        for n in range(count):
            plain.produce(in_topic, value=b"%d" % n, partition=partition)
    plain.flush(30)
    held = transactional_producer(bootstrap)
    held.begin_transaction()
    held.produce(in_topic, value=b"open", partition=1)
    held.flush(30)
    try:
        # A sink that applied up to offsets 3 and 2, and dead letters of both halves.
        schema = sql.Identifier("public")
        pg.execute(
            sql.SQL(
                "INSERT INTO {}.sink_progress (sink, topic, kafka_partition, next_offset)"
                " VALUES ('orders', %(t)s, 0, 3), ('orders', %(t)s, 1, 2)"
            ).format(schema),
            {"t": in_topic},
        )
        pg.execute(
            sql.SQL(
                "INSERT INTO {}.sink_dead_letters (sink, topic, kafka_partition, kafka_offset, error)"
                " VALUES ('orders', %(t)s, 0, 1, 'bad'), ('orders', %(t)s, 0, 2, 'bad')"
            ).format(schema),
            {"t": in_topic},
        )
        pg.execute(
            sql.SQL(
                "INSERT INTO {}.relay_dead_letters (relay, outbox_id, event_id, topic, created_at, error)"
                " VALUES (%s, 1, gen_random_uuid(), %s, now(), 'too large')"
            ).format(schema),
            [relay, out_topic],
        )

        result = outbox("status", "--json", "--transactions", "--older-than", "0", env=env)
        assert result.code == 0, result
        doc = json.loads(result.out)
        assert doc["outbox_rows"] == 2
        [shard] = doc["relays"]
        assert (shard["relay"], shard["shard"], shard["running"]) == (relay, "0/1", False)
        assert shard["rows_waiting"] == 2
        assert [(w["topic"], w["rows"]) for w in shard["waiting"]] == [(out_topic, 2)]
        assert shard["oldest_waiting"] is not None
        ends = {
            p["partition"]: (p["next_offset"], p["high_watermark"], p["lag"], p["beyond_lso"])
            for p in doc["ledgers"]
        }
        assert ends == {0: (3, 5, 2, 0), 1: (2, 3, 1, 1)}, doc["ledgers"]
        dead = {(d["kind"], d["name"]): d["rows"] for d in doc["dead_letters"]}
        assert dead == {("sink", "orders"): 2, ("relay", relay): 1}
        assert doc["kafka_error"] is None
        [line] = doc["transactions"]
        assert line.startswith("LONG-OPEN ") and f"on {in_topic}-1" in line, line

        screen = outbox("status", env=env)
        assert screen.code == 0, screen
        rows = [line.split() for line in screen.out.splitlines() if line.startswith("  ")]
        assert [relay, "0/1", "stopped", "2"] in [r[:4] for r in rows], screen.out
        assert ["orders", f"{in_topic}-1", "2", "3", "1", "1"] in [r[:6] for r in rows], screen.out
        assert "transactions on these topics" not in screen.out

        no_kafka = outbox("status", env={"DATABASE_URL": outbox_db.raw})
        assert no_kafka.code == 0, no_kafka
        assert "topic ends not asked: give --bootstrap-servers" in no_kafka.out
        unasked = [line.split()[:6] for line in no_kafka.out.splitlines() if line.startswith("  orders")]
        assert ["orders", f"{in_topic}-1", "2", "-", "-", "-"] in unasked, no_kafka.out
    finally:
        held.abort_transaction(30)


def test_status_of_a_database_without_the_tables_says_how_to_make_them(database: DatabaseUrl) -> None:
    result = outbox("status", "--url", database.raw)
    assert_one_line_error(result, "outbox_events", "missing", "outbox db upgrade")
    assert result.err.startswith("outbox: error: [TABLES_MISSING] "), result.err
