"""End-to-end smoke run: Kafka -> Spark (kafka_rc, read_committed) -> PostgreSQL.

Produces a few hundred order events in Kafka transactions, plus an aborted
transaction and redelivered duplicates; a Spark job reads them with the
read_committed source and upserts them keyed on event_id; then every row is
checked. Services named by DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS are used as
they are; anything else is started for the run and stopped at the end.

The job is then run a second time with a fresh checkpoint, as after a lost
checkpoint: the sink's ledger turns every replayed event into a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from outbox import migrate
from outbox.core.config import DatabaseUrl, parse_bootstrap
from outbox.core.errors import OutboxError
from outbox.core.java import find_java
from outbox.core.kafka import client_settings
from outbox.core.probe import check_kafka
from outbox_dev.stack import running
from sinks.postgres import BatchResult, PostgresSink, parse_json

TOPIC = "demo.orders"
TABLE = "demo_orders"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500, help="committed events to produce")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("OUTBOX_DEMO_DIR", ".tmp/demo")),
        help="scratch directory, deleted at the end (env OUTBOX_DEMO_DIR)",
    )
    args = parser.parse_args(argv)
    try:
        find_java()  # fail before starting anything
        with running(args.dir / "services") as started:
            env = {
                **{k: os.environ[k] for k in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS") if k in os.environ},
                **started,
            }
            return run(
                DatabaseUrl.parse(env["DATABASE_URL"]),
                parse_bootstrap(env["KAFKA_BOOTSTRAP_SERVERS"]),
                args.events,
                args.dir,
            )
    except OutboxError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    finally:
        _remove(args.dir)


def run(url: DatabaseUrl, bootstrap: str, events: int, work: Path) -> int:
    t0 = time.monotonic()
    check_kafka(bootstrap)
    migrate.upgrade(url, "public")
    create_table(url)
    topic = f"{TOPIC}.{uuid.uuid4().hex[:8]}"
    expected = produce(bootstrap, topic, events)
    say(f"produced {len(expected)} committed events (+ duplicates and an aborted transaction) to {topic}")

    from outbox_dev.local_spark import local_session, stop_session
    from sinks.kafka_source import register

    spark = local_session(work / "spark", app_name="outbox-demo")
    try:
        register(spark)
        first = run_job(spark, bootstrap, topic, url, work / "checkpoint")
        say(f"sink: {first}")
        # Lose the checkpoint and run again from the earliest offset: the ledger makes it a no-op.
        again = run_job(spark, bootstrap, topic, url, work / "checkpoint-lost")
        say(f"sink after a lost checkpoint: {again}")
    finally:
        stop_session(spark)

    with psycopg.connect(url.libpq) as conn:
        rows = dict(
            conn.execute(sql.SQL("SELECT event_id::text, amount FROM {}").format(sql.Identifier(TABLE)))
        )
    missing = set(expected) - set(rows)
    extra = set(rows) - set(expected)
    wrong = {k for k in set(expected) & set(rows) if rows[k] != expected[k]}
    say(
        f"postgres table {TABLE}: {len(rows)} rows; missing {len(missing)}, unexpected {len(extra)},"
        f" wrong amount {len(wrong)}  ({time.monotonic() - t0:.1f}s)"
    )
    if missing or extra or wrong:
        say("FAILED: the table does not hold exactly the committed events")
        return 1
    if again is None or again.upserted or again.deleted or again.fresh:
        say("FAILED: replaying after a lost checkpoint changed the table")
        return 1
    say("OK: every committed event applied once; aborted and duplicate records left no trace")
    return 0


def create_table(url: DatabaseUrl) -> None:
    with psycopg.connect(url.libpq) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (event_id uuid PRIMARY KEY, order_id bigint NOT NULL,"
                " amount numeric(12, 2) NOT NULL, status text NOT NULL)"
            ).format(sql.Identifier(TABLE))
        )
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(TABLE)))


def produce(bootstrap: str, topic: str, events: int) -> dict[str, object]:
    """Committed events (returned: event_id -> amount), redelivered duplicates, one aborted batch."""
    from decimal import Decimal

    admin = AdminClient(client_settings({"bootstrap.servers": bootstrap}, "admin"))
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result(30)
    producer = Producer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"demo-{topic}",
                "partitioner": "murmur2_random",
            },
            "producer",
        )
    )
    producer.init_transactions(30)
    committed: dict[str, object] = {}
    batch: list[tuple[bytes, bytes]] = []

    def send(records: list[tuple[bytes, bytes]], commit: bool) -> None:
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic, key=key, value=value)
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)

    for i in range(events):
        event = {
            "event_id": str(uuid.uuid4()),
            "order_id": i,
            "amount": f"{(i * 37) % 1000 + 0.5:.2f}",
            "status": "placed",
        }
        committed[event["event_id"]] = Decimal(event["amount"])
        record = (str(i).encode(), json.dumps(event).encode())
        batch.append(record)
        if i % 10 == 0:
            batch.append(record)  # a redelivery: same event id again
        if len(batch) >= 100:
            send(batch, commit=True)
            batch = []
    if batch:
        send(batch, commit=True)
    bogus = [
        (
            b"x",
            json.dumps(
                {"event_id": str(uuid.uuid4()), "order_id": -1, "amount": "0", "status": "aborted"}
            ).encode(),
        )
        for _ in range(50)
    ]
    send(bogus, commit=False)
    return committed


def run_job(spark, bootstrap: str, topic: str, url: DatabaseUrl, checkpoint: Path) -> BatchResult | None:  # type: ignore[no-untyped-def]
    """The user's job: read committed events, parse the JSON value, apply each exactly once."""
    raw = (
        spark.readStream.format("kafka_rc")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    orders = parse_json(raw, "event_id string, order_id long, amount decimal(12,2), status string")
    sink = PostgresSink(TABLE, url=url.raw, key="event_id")
    sink.start(orders, str(checkpoint), trigger={"availableNow": True}).awaitTermination()
    return sink.last


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    if path.parent.name == ".tmp" and path.parent.exists() and not any(path.parent.iterdir()):
        path.parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
