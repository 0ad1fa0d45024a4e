"""The relay bench's fault runs: each publisher killed -9 mid-stream and inside one transaction, then
every committed event looked for on the topic, the missing ones placed by their WAL position."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
from debezium import OnOutbox  # bench/debezium.py
from relay_backlog import create_topic  # bench/relay_backlog.py
from relay_latency import Arrivals  # bench/relay_latency.py
from relay_peers import FLUSH_MS, FLUSHED, LABELS, PEERS  # bench/relay_peers.py
from relay_runner import relay_process  # bench/relay_runner.py

from outbox.core import tables
from outbox.core.config import DatabaseUrl
from outbox.writer import Event, add_events

PROBE = f"bench_relay_probe_{os.getpid()}"  # the temporary slot that tells each row's LSN in a fault
# When each publisher records how far it got, which is what a kill -9 replays from: beside its duplicates.
FLUSHES = {
    "relay": "in each Kafka transaction, with its records",
    "relay_at_least_once": "after each batch is flushed",
    "debezium": "every 60 s (offset.flush.interval.ms, Connect's default)",
    "debezium_flush_1s": f"every {FLUSH_MS / 1000:.0f} s (offset.flush.interval.ms)",
    "debezium_eos": "in each poll's Kafka transaction (KIP-618)",
}


def fault(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    *,
    seconds: float,
    rate: int = 2000,
) -> dict[str, object]:
    """Writers at `rate`/s for `seconds`, 10 events a transaction; the publisher is killed -9
    halfway and started again at once.

    Then every committed event is looked for on the topic: duplicates and missing, counted, and
    the missing placed (`losses`).
    """
    topic = create_topic(bootstrap)
    row: dict[bytes, int] = {}  # event id -> its place in commit order
    with lsn_probe(url) as probe:
        start()
        arrivals = Arrivals(bootstrap, topic)
        arrivals.start()

        def write() -> None:
            per_txn, interval = 10, 10 / rate
            with psycopg.connect(url.libpq) as conn:
                next_at = time.monotonic()
                end = next_at + seconds
                while next_at < end:
                    first = len(row)
                    events = [Event(topic, {"n": first}, key=f"k{i % 97}") for i in range(per_txn)]
                    add_events(conn, events, schema=schema)
                    conn.commit()
                    row.update((str(e.event_id).encode(), first + i) for i, e in enumerate(events))
                    next_at += interval
                    time.sleep(max(0.0, next_at - time.monotonic()))

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(seconds / 2)
        kill()
        seen = set(arrivals.first)
        start()
        writer.join()
        return losses(arrivals, row, seen, kill, probe, schema)


def fault_inside_transaction(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    *,
    size: int,
) -> dict[str, object]:
    """One transaction of `size` events written with one COPY; the publisher killed -9 as soon as
    the bench reads the first of them from the topic, and started again at once.

    A COPY writes a heap page's rows as one WAL record, so they share a WAL position (an LSN): a
    reader that resumes from a position inside such a group may skip the rest of it.
    """

    def write(topic: str) -> dict[bytes, int]:
        events = [Event(topic, {"n": i}, key=f"k{i % 97}") for i in range(size)]
        with psycopg.connect(url.libpq) as conn:
            add_events(conn, events, schema=schema)
        return {str(e.event_id).encode(): i for i, e in enumerate(events)}

    return killed_at_first_read(url, bootstrap, schema, start, kill, write)


def killed_at_first_read(
    url: DatabaseUrl,
    bootstrap: str,
    schema: str,
    start: Callable[[], None],
    kill: Callable[[], None],
    write: Callable[[str], dict[bytes, int]],
    id_header: str = tables.EVENT_ID_HEADER,
    table: tuple[str, str] = (tables.OUTBOX_EVENTS, "event_id"),
) -> dict[str, object]:
    """`write(topic)` (one transaction; event id -> place) while the publisher runs, which is killed
    -9 as soon as the bench reads the first event, and started again at once; then `losses`."""
    topic = create_topic(bootstrap)
    with lsn_probe(url) as probe:
        start()
        arrivals = Arrivals(bootstrap, topic, id_header)
        arrivals.start()
        time.sleep(3)  # the reader's group joined: its first arrivals are not late
        row = write(topic)
        deadline = time.monotonic() + 120
        while not arrivals.first and time.monotonic() < deadline:
            time.sleep(0.001)
        kill()
        seen = set(arrivals.first)
        start()
        return losses(arrivals, row, seen, kill, probe, schema, table)


@contextlib.contextmanager
def lsn_probe(url: DatabaseUrl) -> Iterator[psycopg.Connection | None]:
    """A session holding a logical slot (test_decoding, temporary: gone with the session however
    the bench ends), made before a fault's writes: it tells each written row's LSN. None where the
    server has no test_decoding: missing rows are then counted, not placed."""
    with psycopg.connect(url.libpq, autocommit=True) as conn:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', true)", [PROBE])
        except psycopg.Error:
            yield None
        else:
            yield conn


def losses(
    arrivals: Arrivals,
    row: dict[bytes, int],
    seen: set[bytes],
    kill: Callable[[], None],
    probe: psycopg.Connection | None,
    schema: str,
    table: tuple[str, str] = (tables.OUTBOX_EVENTS, "event_id"),
) -> dict[str, object]:
    """Once every committed event (`row`: event id -> its place) is out, or 120 s: duplicates and
    missing, and which rows are missing, with the LSNs they share with rows that came out.
    `seen`: what the bench had read when it killed the publisher; `table`: the table the rows
    were written to, and its event id column."""
    arrivals.wait_for(len(row), 120)
    time.sleep(2)  # late duplicates
    arrivals.close()
    kill()
    missing = sorted(row[e] for e in row.keys() - arrivals.first.keys())
    out: dict[str, object] = {
        "committed": len(row),
        "read_at_kill": len(seen),
        "duplicates": arrivals.records - len(arrivals.first),
        "missing": len(missing),
    }
    if probe is not None:  # a COPY's rows share a WAL position a page at a time
        out["wal_positions"] = _wal_positions(probe, schema, table[0])
    if missing:
        out["missing_rows"] = _spans(missing)
        if probe is not None:
            out["missing_by_lsn"] = _by_lsn(probe, schema, table, row, set(missing), {row[e] for e in seen})
    return out


def _wal_positions(probe: psycopg.Connection, schema: str, table: str) -> int:
    """How many WAL positions the rows written to the table since the probe began took."""
    (count,) = probe.execute(
        "SELECT count(DISTINCT lsn) FROM pg_logical_slot_peek_changes(%s, NULL, NULL) WHERE data LIKE %s",
        [PROBE, f"table {schema}.{table}: INSERT:%"],
    ).fetchone() or (0,)
    return int(count)


def _spans(rows: list[int]) -> str:
    """Sorted row numbers as runs: "25-60, 71"."""
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def _by_lsn(
    probe: psycopg.Connection,
    schema: str,
    table: tuple[str, str],
    row: dict[bytes, int],
    missing: set[int],
    seen: set[int],
) -> list[dict[str, object]]:
    """For each LSN a missing row has: which of the transaction's rows have it, how many of them
    the bench had read when it killed the publisher, how many are missing."""
    changes = probe.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", [PROBE]
    ).fetchall()
    marker, written = f"{table[1]}[uuid]:'", f"table {schema}.{table[0]}: INSERT:"
    lsn_rows: dict[str, list[int]] = {}
    for lsn, data in changes:
        if data.startswith(written) and marker in data:
            event = data.split(marker, 1)[1].split("'", 1)[0].encode()
            if event in row:
                lsn_rows.setdefault(lsn, []).append(row[event])
    return [
        {
            "lsn": lsn,
            "rows": _spans(sorted(rows)),
            "read_at_kill": sum(r in seen for r in rows),
            "missing": sum(r in missing for r in rows),
        }
        for lsn, rows in sorted(lsn_rows.items())
        if missing.intersection(rows)
    ]


# The fault comparisons, each run on every publisher: the JSON key, how a line names it, the fault.
# A fault's injection: (url, bootstrap, schema, start, kill, its size by keyword) -> what it found.
Inject = Callable[..., dict[str, object]]
FAULTS: dict[str, tuple[str, Inject]] = {
    "faults": ("mid-stream", fault),
    "faults_inside_transaction": ("inside one transaction", fault_inside_transaction),
}


def fault_runs(
    kind: str,
    what: str,
    inject: Inject,
    url: DatabaseUrl,
    bootstrap: str,
    tmp: Path,
    peers: dict[str, OnOutbox],
) -> dict[str, dict[str, object]]:
    """One fault (`kind`) on every publisher in turn, each found printed: what each found, with when
    it records its position."""
    faulted = {"relay": ("public", *relay_process(url, bootstrap, tmp))}
    if kind == "faults":  # beside Debezium at least once: the relay at least once
        faulted["relay_at_least_once"] = ("public", *relay_process(url, bootstrap, tmp, "at-least-once"))
    for name, dbz in peers.items():
        if kind == "faults" or name in PEERS:
            faulted[name] = (dbz.schema, dbz.start, functools.partial(dbz.kill, signal.SIGKILL))
    found_by: dict[str, dict[str, object]] = {}
    for who, (schema, start, kill) in faulted.items():
        if who in FLUSHED and kind == "faults":
            # Its slot made now: made with the others, it would first decode all the WAL since.
            peers[who].start()
            peers[who].kill(signal.SIGTERM)
        found = inject(url, bootstrap, schema, start, kill)
        found_by[who] = {**found, "records_position": FLUSHES[who]}
        print(f"kill -9 {what}, {LABELS.get(who, who)}: {_lost(found_by[who])}", flush=True)
    return found_by


def _lost(f: dict) -> str:
    """A fault's line: what was committed and read at the kill, duplicates, and what is missing where."""
    line = (
        f"{f['committed']:,} committed, {f['read_at_kill']:,} read when it was killed;"
        f" {f['duplicates']} duplicates, {f['missing']} missing;"
        f" its position recorded {f['records_position']}"
    )
    if f["missing"]:
        line += f" (rows {f['missing_rows']}, in commit order)"
    for group in f.get("missing_by_lsn", []):
        line += (
            f"; LSN {group['lsn']} holds rows {group['rows']}: {group['read_at_kill']} of them read"
            f" before the kill, {group['missing']} missing"
        )
    return line
