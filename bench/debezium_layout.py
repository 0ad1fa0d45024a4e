"""Debezium on an outbox table of its own layout, killed -9 inside one transaction, beside the
relay publishing the same kind of table through `outbox db adopt-debezium`.

bench/relay.py measures Debezium on our outbox table, whose BEFORE ROW trigger makes PostgreSQL
write a COPY's rows one WAL record each. Users of Debezium's EventRouter have no such trigger:
a COPY there writes a heap page's rows as one WAL record, so they share one LSN, and a connector
that resumes from inside such a group may skip the rest of it (debezium/dbz#1554, fixed by
debezium/debezium PR 7531 in 3.7.0). This bench writes, for each publisher, one transaction of
EVENTS rows into a table shaped as Debezium's documentation has it (id uuid, aggregatetype,
aggregateid, type, payload jsonb; no trigger), once with one COPY and once with multi-row
INSERTs of 1,000 rows; kills the publisher -9 as soon as the bench reads the first event; starts
it again at once; and looks for every event on the topic. A probe slot (test_decoding) counts
the LSNs the rows were written at and places any missing row among them.

Publishers: Debezium 3.6.1 at least once (a standalone worker, offsets flushed at Connect's
default of 60 s, and every 1 s) and exactly once (KIP-618), with the router's defaults but the
topic (the aggregate type is the topic's name), keys and values as strings; the relay, exactly
once, run with `--event-id-header id` on a table adopted by `outbox db adopt-debezium`.

    python bench/debezium_layout.py [--events 30000] [--writes copy,insert] [--json] [--save]

Uses DATABASE_URL / KAFKA_BOOTSTRAP_SERVERS if set (PostgreSQL with wal_level=logical), else
starts embedded services. The exit status is 1 if the relay lost or repeated an event.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import flags  # bench/flags.py
import psycopg
from psycopg import sql
from relay import FLUSH_MS, FLUSHES, LABELS, killed_at_first_read, relay_process  # bench/relay.py
from services import services  # bench/services.py

from outbox import debezium, logs, migrate
from outbox.core.config import DatabaseUrl
from outbox_dev.debezium import Debezium

TABLE = "outbox"
INSERT_ROWS = 1000  # rows per multi-row INSERT
STRINGS = "org.apache.kafka.connect.storage.StringConverter"
# The router's defaults but the topic, which is the aggregate type itself here.
ROUTER = {"route.topic.replacement": debezium.ROUTED}
# Each publisher's schema: its own copy of the table, so its slot reads only its own rows.
SCHEMAS = {"debezium": "dbz", "debezium_flush_1s": "dbz_flush", "debezium_eos": "dbz_eos", "relay": "public"}
WRITES = ("copy", "insert")


def layout(url: DatabaseUrl, schema: str) -> None:
    """The table as Debezium's outbox documentation has it, with no trigger of ours."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,"
                " aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb)"
            ).format(sql.Identifier(schema, TABLE))
        )


def write(url: DatabaseUrl, schema: str, topic: str, events: int, how: str) -> dict[bytes, int]:
    """One transaction of `events` rows, by one COPY or by multi-row INSERTs; event id -> place."""
    rows = [(uuid.uuid4(), topic, f"k{i % 97}", "Bench", json.dumps({"n": i})) for i in range(events)]
    table = sql.Identifier(schema, TABLE)
    columns = sql.SQL("(id, aggregatetype, aggregateid, type, payload)")
    with psycopg.connect(url.libpq) as conn, conn.transaction():
        if how == "copy":
            with conn.cursor().copy(sql.SQL("COPY {} {} FROM STDIN").format(table, columns)) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            for at in range(0, events, INSERT_ROWS):
                part = rows[at : at + INSERT_ROWS]
                values = sql.SQL(", ").join(sql.SQL("(%s, %s, %s, %s, %s)") for _ in part)
                conn.execute(
                    sql.SQL("INSERT INTO {} {} VALUES {}").format(table, columns, values),
                    [v for row in part for v in row],
                )
    return {str(row[0]).encode(): i for i, row in enumerate(rows)}


def killed_inside(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    events: int,
    how: str,
) -> dict[str, object]:
    """The transaction written while the publisher runs; it is killed -9 as soon as the bench reads
    the first event, and started again at once."""
    return killed_at_first_read(
        url,
        bootstrap,
        schema,
        start,
        kill,
        lambda topic: write(url, schema, topic, events, how),
        id_header=debezium.ID_HEADER,
        table=(TABLE, "id"),
    )


def main() -> int:
    parser = flags.parser(__doc__, events=30_000, size_help="unused: each payload is a small JSON object")
    parser.add_argument("--writes", default=",".join(WRITES), help="copy, insert, or both")
    parser.add_argument("--no-debezium", action="store_true", help="the relay alone")
    args = parser.parse_args()
    writes = [w for w in args.writes.split(",") if w]
    if not writes or set(writes) - set(WRITES):
        parser.error(f"--writes takes {' and '.join(WRITES)}, comma separated")
    logs.configure("text", logging.WARNING)
    publishers = ["relay"] if args.no_debezium else list(SCHEMAS)
    result: dict[str, object] = {"events": args.events, "rows_per_insert": INSERT_ROWS}
    with (
        tempfile.TemporaryDirectory(prefix="bench-dbz-layout-", dir=os.environ.get("TMPDIR")) as tmp,
        services(Path(tmp) / "services") as (url, bootstrap),
    ):
        for name in publishers:
            layout(url, SCHEMAS[name])
        migrate.upgrade(url, SCHEMAS["relay"])
        with psycopg.connect(url.libpq, autocommit=True) as conn:
            debezium.install(conn, SCHEMAS["relay"], TABLE, SCHEMAS["relay"], debezium.Router.of(ROUTER))
        peers = {
            name: Debezium(
                Path(tmp) / name,
                url,
                bootstrap,
                [f"{SCHEMAS[name]}.{TABLE}"],
                {
                    "transforms": "outbox",
                    "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                    **{f"transforms.outbox.{k}": v for k, v in ROUTER.items()},
                },
                exactly_once=name == "debezium_eos",
                flush_ms=FLUSH_MS if name == "debezium_flush_1s" else None,
                worker_settings={"key.converter": STRINGS, "value.converter": STRINGS},
            )
            for name in publishers
            if name != "relay"
        }
        try:
            for how in writes:
                runs: dict[str, object] = {}
                for name in publishers:
                    if name == "relay":
                        start, kill = relay_process(
                            url, bootstrap, Path(tmp), "exactly-once", "--event-id-header", debezium.ID_HEADER
                        )
                    else:
                        start, kill = peers[name].start, peers[name].kill
                    run = killed_inside(url, bootstrap, SCHEMAS[name], start, kill, args.events, how)
                    runs[name] = {**run, "records_position": FLUSHES[name]}
                    print(f"{how:6} {LABELS.get(name, name):38} {_line(run)}", flush=True)
                result[how] = runs
        finally:
            for dbz in peers.values():
                dbz.drop_slot()  # a slot left behind would hold WAL on the server for ever
    flags.finish("debezium-layout", result, args)
    relay = [of_how["relay"] for how in writes if isinstance(of_how := result[how], dict)]
    return 1 if any(r["missing"] or r["duplicates"] for r in relay) else 0


def _line(run: dict[str, object]) -> str:
    line = (
        f"read at kill {run['read_at_kill']:>6}  duplicates {run['duplicates']:>6}"
        f"  missing {run['missing']:>6}"
        f"  ({run['committed']} rows at {run['wal_positions']} WAL positions)"
    )
    return line + (f"; missing rows {run['missing_rows']}" if run.get("missing_rows") else "")


if __name__ == "__main__":
    raise SystemExit(main())
