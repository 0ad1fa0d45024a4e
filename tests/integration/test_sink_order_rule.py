"""The sink's rule, for every input: the table ends as if the committed events were applied one by one.

One by one means: in offset order per topic-partition (a key's events share a
partition, as Kafka's partitioner puts them), with the version guard, deletes,
refused rows dead-lettered and one outbox event per change. Hypothesis draws
sequences of upserts, stale versions, tombstones, redeliveries and rows the
table refuses; each is applied three ways (as one batch, one record per
batch, and cut into batches at random) straight through the stage table, in
any order (the rule must not hang on the order rows are staged in), and
`apply_batch`, and the table, the dead letters and the outbox events must be
the same each time and equal to the plain-Python model below.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal

import hypothesis.strategies as st
import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from psycopg import sql
from pyspark.sql import types as T

from outbox.core.config import DatabaseUrl
from outbox.trace.outcomes import COLUMNS, ORDER, TraceRow, records
from sinks.postgres.apply import BatchResult, apply_batch, apply_rows
from sinks.postgres.catalog import describe
from sinks.postgres.plan import plan
from sinks.postgres.settings import Mode, Outbox
from sinks.postgres.spec import SinkSpec
from sinks.postgres.statements import Statements

KEYS = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(4)]
PARTITIONS = 2
ATTEMPT = 7
FRAME = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("n", T.LongType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("version", T.IntegerType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
    ]
)


@dataclass(frozen=True)
class Event:
    key: str
    delete: bool
    n: int
    amount: int  # negative: the table's CHECK refuses the row
    version: int | None

    @property
    def partition(self) -> int:
        return KEYS.index(self.key) % PARTITIONS


events = st.lists(
    st.builds(
        Event,
        key=st.sampled_from(KEYS),
        delete=st.sampled_from([False, False, True]),
        n=st.integers(0, 2),
        amount=st.sampled_from([-1, 0, 1, 2]),
        version=st.none() | st.integers(1, 4),
    ),
    min_size=1,
    max_size=24,
)


def positioned(drawn: list[Event]) -> list[tuple[int, int, Event]]:
    """(partition, offset, event): offsets in the order drawn, per partition."""
    next_offset = [0] * PARTITIONS
    out = []
    for e in drawn:
        out.append((e.partition, next_offset[e.partition], e))
        next_offset[e.partition] += 1
    return out


def model(
    log: list[tuple[int, int, Event]], mode: Mode, versioned: bool, traced: bool = False
) -> tuple[dict, set, dict, dict]:
    """The rule, one event at a time: (table, dead letters, outbox events per key, and when traced,
    each record's outcome as a trace decides it)."""
    table: dict[str, tuple] = {}
    dead: set[tuple[int, int]] = set()
    outbox: dict[str, list] = {}
    outcomes: dict[tuple[int, int], str] = {}

    def skipped(row: tuple | None, version: int | None) -> str:
        older = version is not None and row is not None and row[2] is not None and row[2] > version
        return "stale" if older else "duplicate"

    for partition, offset, e in log_order(log):
        at = (partition, offset)
        row = table.get(e.key)
        version = e.version if versioned else None
        if e.delete:
            if row is None:
                outcomes[at] = "duplicate"
                continue
            if versioned and version is not None and row[2] is not None and row[2] > version:
                outcomes[at] = "stale"
                continue  # an older delete never removes a newer row
            del table[e.key]
            outbox.setdefault(e.key, []).append(None)
            outcomes[at] = "deleted"
            continue
        new = (e.n, _cents(e.amount), version)
        if e.amount < 0:  # CHECK (amount >= 0): refused whatever else happens
            dead.add(at)
            continue
        if row is not None:
            if mode == "insert":
                outcomes[at] = "duplicate"
                continue
            if versioned and row[2] is not None and (version is None or row[2] > version):
                outcomes[at] = skipped(row, version)
                continue  # never replaced by an older (or unversioned) event
            if row == new:
                outcomes[at] = "duplicate"
                continue  # a redelivery changes nothing
        table[e.key] = new
        outbox.setdefault(e.key, []).append(new)
        outcomes[at] = "applied"
    return table, dead, outbox, outcomes if traced else {}


def _cents(amount: object) -> Decimal:
    return Decimal(str(amount)).quantize(Decimal("0.01"))


def apply_in_batches(
    conn: psycopg.Connection,
    st_: Statements,
    log: list[tuple[int, int, Event]],
    cuts: list[list[int]],
    staging: random.Random,
) -> list[BatchResult]:
    """Apply the log in batches: batch i holds, per partition, the offsets below cuts[i][partition],
    staged in an order `staging` draws."""
    results = []
    done = [0] * PARTITIONS
    for batch_id, cut in enumerate(cuts):
        rows = [(p, o, e) for p, o, e in log if done[p] <= o < cut[p]]
        done = [max(d, c) for d, c in zip(done, cut, strict=True)]
        if not rows:
            continue
        staging.shuffle(rows)
        with conn.transaction():  # a task's stage lives as long as its transaction
            conn.execute(st_.create_stage())
            with conn.cursor().copy(
                sql.SQL(
                    "COPY {} (c0, c1, c2, c3, _topic, _partition, _offset, _delete, _attempt) FROM STDIN"
                ).format(st_.names.stage)
            ) as copy:
                for p, o, e in rows:
                    # A delete carries its version (delete="..." rules); a tombstone's is None.
                    values = (None, None, e.version) if e.delete else (e.n, e.amount, e.version)
                    copy.write_row((e.key, *values, "t", p, o, e.delete, ATTEMPT))
            deletes = any(e.delete for _, _, e in rows)
            results.append(applied(conn, st_, batch_id, len(rows), deletes, dead=False))
    return results


def applied(
    conn: psycopg.Connection, st_: Statements, batch_id: int, staged: int, deletes: bool, dead: bool
) -> BatchResult:
    """The stage applied as the driver applies its own (asking it), or as a task applies a stage it
    found past the ledger: telling the statements what its rows hold (deletes, dead letters)."""
    if not st_.unapplied:
        return apply_batch(conn, [st_], batch_id, [ATTEMPT], staged)
    counts = apply_rows(conn, st_, {"sink": st_.spec.name, "attempts": [ATTEMPT]}, deletes, dead)
    return BatchResult(batch_id, **counts._asdict())


def statements_for(spec: SinkSpec, conn: psycopg.Connection, past_ledger: bool) -> Statements:
    """The driver's statements on its shared stage; or a task's, for a stage whose every row is past
    the ledger (as each batch here is: its cuts only move on), which reads it without the ledger."""
    made = Statements(spec, plan(FRAME, describe(conn, "public", "orders"), spec), in_task=past_ledger)
    return made.past_ledger() if past_ledger else made


def one_record_each(log: list[tuple[int, int, Event]], ends: list[int]) -> list[list[int]]:
    """Cuts that make each record its own batch, partition 0's first."""
    return [
        [o + 1 if q == p else (ends[q] if q < p else 0) for q in range(PARTITIONS)]
        for p, o, _ in log_order(log)
    ]


def growing(points: list[tuple[int, int]], ends: list[int]) -> list[list[int]]:
    """Random cut points made into batch ends: within the log, never moving back, the last at the end."""
    cuts: list[list[int]] = []
    for point in [*sorted(points, key=sum), tuple(ends)]:
        previous = cuts[-1] if cuts else [0] * PARTITIONS
        cuts.append([max(previous[q], min(point[q], ends[q])) for q in range(PARTITIONS)])
    return cuts


def log_order(log: list[tuple[int, int, Event]]) -> list[tuple[int, int, Event]]:
    return sorted(log, key=lambda x: (x[0], x[1]))


def observed(conn: psycopg.Connection) -> tuple[dict, set, dict, dict]:
    table = {
        k: (n, a, v) for k, n, a, v in conn.execute("SELECT event_id::text, n, amount, version FROM orders")
    }
    dead = set(conn.execute("SELECT kafka_partition, kafka_offset FROM sink_dead_letters").fetchall())
    outbox: dict[str, list] = {}
    for key, value in conn.execute("SELECT convert_from(key, 'UTF8'), value FROM outbox_events ORDER BY id"):
        doc = None if value is None else json.loads(bytes(value))
        row = None if doc is None else (doc["n"], _cents(doc["amount"]), doc["version"])
        outbox.setdefault(key, []).append(row)
    rows = conn.execute(f"SELECT {COLUMNS} FROM sink_traces ORDER BY {ORDER}").fetchall()
    traced = {(r.partition, r.offset): r.outcome for r in records([TraceRow(*row) for row in rows])}
    return table, dead, outbox, traced


@pytest.fixture
def checked_db(db: DatabaseUrl, pg: psycopg.Connection) -> DatabaseUrl:
    pg.execute("ALTER TABLE orders ADD CONSTRAINT amount_not_negative CHECK (amount >= 0)")
    return db


@pytest.mark.parametrize(
    ("mode", "versioned", "traced", "past_ledger"),
    [
        ("upsert", False, False, False),
        ("upsert", True, False, False),
        ("insert", False, False, False),
        ("upsert", True, True, False),
        ("insert", False, True, False),
        ("upsert", False, False, True),
        ("upsert", True, False, True),
        ("insert", False, False, True),
        ("upsert", True, True, True),
        ("insert", False, True, True),
    ],
)
def test_any_batch_boundaries_give_the_one_by_one_result(
    checked_db: DatabaseUrl, mode: Mode, versioned: bool, traced: bool, past_ledger: bool
) -> None:
    """Traced, each record's outcome is the one-by-one rule's too; tracing changes nothing else.
    past_ledger: as a task applies a stage it found wholly past the ledger (task.py)."""
    spec = SinkSpec(
        url=checked_db,
        table="orders",
        mode=mode,
        version="version" if versioned else None,
        outbox=Outbox(topic="changes", key="written.event_id::text"),
        trace=traced,
    )
    with psycopg.connect(checked_db.libpq, autocommit=True) as conn:
        statements = statements_for(spec, conn, past_ledger)

        @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(
            drawn=events,
            cut_points=st.lists(st.tuples(st.integers(0, 24), st.integers(0, 24)), max_size=6),
            staging=st.randoms(use_true_random=False),
        )
        def check(drawn: list[Event], cut_points: list[tuple[int, int]], staging: random.Random) -> None:
            if not versioned:
                drawn = [Event(e.key, e.delete, e.n, e.amount, None) for e in drawn]
            log = positioned(drawn)
            ends = [sum(1 for p, _, _ in log if p == q) for q in range(PARTITIONS)]
            for cuts in ([ends], one_record_each(log, ends), growing(cut_points, ends)):
                conn.execute("TRUNCATE orders, sink_progress, sink_dead_letters, outbox_events, sink_traces")
                results = apply_in_batches(conn, statements, log, cuts, staging)
                assert observed(conn) == model(log, mode, versioned, traced), f"batches cut at {cuts}"
                # The counts the sink keeps say what the rule did, duplicates and stale versions apart.
                said = Counter(model(log, mode, versioned, traced=True)[3].values())
                assert sum(r.stale for r in results) == said["stale"], f"batches cut at {cuts}"
                assert sum(r.duplicates for r in results) == said["duplicate"], f"batches cut at {cuts}"
                ledger = dict(
                    conn.execute("SELECT kafka_partition, next_offset FROM sink_progress").fetchall()
                )
                assert ledger == {p: end for p, end in enumerate(ends) if end}

        check()


class Backwards(random.Random):
    """Stages each batch's rows last offset first."""

    def shuffle(self, x: list) -> None:  # type: ignore[override]  # the same effect, one order
        x.reverse()


@pytest.mark.parametrize("past_ledger", [False, True])
@pytest.mark.parametrize("versioned", [False, True])
def test_a_keys_later_event_staged_first_and_changing_nothing_still_comes_last(
    db: DatabaseUrl, versioned: bool, past_ledger: bool
) -> None:
    """The row holds X; the batch has the key's events Y then X, staged X first. One by one the
    row ends at X. One statement, where X changes nothing and Y then writes, would end at Y:
    such a batch must go in rounds. (Versioned, all versions equal: an equal version replaces.)"""
    spec = SinkSpec(url=db, table="orders", version="version" if versioned else None)
    with psycopg.connect(db.libpq, autocommit=True) as conn:
        statements = statements_for(spec, conn, past_ledger)
        version = 1 if versioned else None
        log = positioned([Event(KEYS[0], False, n, 1, version) for n in (1, 2, 1)])
        results = apply_in_batches(conn, statements, log, [[1, 0], [3, 0]], Backwards())
        assert observed(conn)[0] == model(log, "upsert", versioned)[0]
        assert [r.upserted for r in results] == [1, 2]


def test_a_stage_past_the_ledger_with_rows_that_did_not_parse_ends_as_through_the_ledger(
    db: DatabaseUrl,
) -> None:
    """Rows staged as dead letters (a value that did not parse) are counted and kept alike by a
    task's statements for a stage past the ledger and by the general ones: the table, the dead
    letters, the ledger and every count."""
    spec = SinkSpec(url=db, table="orders", version="version")
    with psycopg.connect(db.libpq, autocommit=True) as conn:
        general = Statements(spec, plan(FRAME, describe(conn, "public", "orders"), spec), in_task=True)

        @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(drawn=events, unparsed=st.sets(st.tuples(st.integers(0, PARTITIONS - 1), st.integers(0, 23))))
        # One statement applies it (no key twice among the rows that parsed, no delete, none refused).
        @example(
            drawn=[
                Event(KEYS[0], False, 1, 1, 1),
                Event(KEYS[1], False, 1, 1, 1),
                Event(KEYS[0], False, 2, 1, 2),
            ],
            unparsed={(0, 1)},
        )
        def check(drawn: list[Event], unparsed: set[tuple[int, int]]) -> None:
            log = positioned(drawn)
            ends = []
            for st_ in (general, general.past_ledger()):
                conn.execute("TRUNCATE orders, sink_progress, sink_dead_letters")
                with conn.transaction():
                    conn.execute(st_.create_stage(ATTEMPT))
                    rows = sql.SQL(
                        "COPY {} (c0, c1, c2, c3, _topic, _partition, _offset, _delete) FROM STDIN"
                    )
                    with conn.cursor().copy(rows.format(st_.names.stage)) as copy:
                        for p, o, e in log:
                            if (p, o) not in unparsed:
                                values = (None, None, e.version) if e.delete else (e.n, e.amount, e.version)
                                copy.write_row((e.key, *values, "t", p, o, e.delete))
                    with conn.cursor().copy(st_.copy_dead()) as copy:
                        for p, o, _ in log:
                            if (p, o) in unparsed:
                                copy.write_row(("t", p, o, False, "did not parse", b"k", b"{"))
                    deletes = any(e.delete for _, _, e in log)
                    dead = any((p, o) in unparsed for p, o, _ in log)
                    result = applied(conn, st_, 0, len(log), deletes, dead)
                ledger = conn.execute(
                    "SELECT kafka_partition, next_offset FROM sink_progress ORDER BY 1"
                ).fetchall()
                dead = conn.execute(
                    "SELECT kafka_partition, kafka_offset, error FROM sink_dead_letters ORDER BY 1, 2"
                )
                ends.append((result, observed(conn)[0], dead.fetchall(), ledger))
            assert ends[0] == ends[1]
            assert ends[1][0].dead >= sum(1 for p, o, _ in log if (p, o) in unparsed)

        check()
