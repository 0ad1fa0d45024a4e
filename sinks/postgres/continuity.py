"""Whether PostgreSQL still holds every batch that Spark's checkpoint counts as applied.

Spark moves its checkpoint past a batch once the sink returns. PostgreSQL can
lose that batch's commits afterwards: a failover to an asynchronous replica, a
restore, a crash of a server without fsync. Spark would go on from its
checkpoint and those events would never be read again. So each batch records
(query, batch id) in its own commit, and the next batch checks that the
database still shows the one before it. WAL keeps commits in order: if that
record survived, every earlier commit of the sink did too. Records are kept
by query: a new checkpoint's query, whose batch 0 a restore took away, finds
no record of its own rather than an older query's, which proves nothing.
"""

from __future__ import annotations

import json

import psycopg
from pyspark.sql import DataFrame

from outbox.core.errors import OutboxError
from sinks.errors import error
from sinks.kafka_source.ranges import to_offsets
from sinks.ledger import Positions, positions
from sinks.postgres.spark_plan import is_connect
from sinks.postgres.statements import Statements


def lost(last: int | None, query: str | None, batch: int) -> range:
    """The batches of `query` before `batch` that the database no longer shows; empty if none.

    last: the last batch of `query` the database shows (None: none). Spark starts batch N only
    once N-1 returned, so the database must show N-1, or N itself when N is replayed after a
    crash; a query at batch N > 0 of which it shows none has lost them all, unless its checkpoint
    was never this sink's (`outbox sinks adopt` records it). No query: nothing to compare.
    """
    if query is None:
        return range(0)
    return range(0 if last is None else last + 1, batch)


def behind(ledger: Positions, ends: Positions) -> list[tuple[str, int]]:
    """The topic-partitions whose ledger stands before the end a task committed for them.

    In the tasks, each topic-partition commits on its own. A crash or failover
    can lose one task's commit while another task, retried, commits on the
    server that came back: the batch's record, written after them, then sits
    on a history without the lost one. Before it is written, every task's end
    must show in the ledger; a record written after that vouches for them all.
    """
    return sorted(tp for tp, end in ends.items() if ledger.get(tp, 0) < end)


def query_id(batch: DataFrame, checkpoint: str | None = None) -> str | None:
    """The id of the streaming query running `batch`; None outside one (or where Spark does not say).

    Classic Spark says it in a local property of the batch's thread. A Spark
    Connect client has no SparkContext: there the id comes from the query's
    `checkpoint`, whose metadata file Spark writes before the first batch.
    """
    if not is_connect(batch):
        return batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    if checkpoint is None:
        return None
    metadata = batch.sparkSession.read.text(f"{checkpoint.rstrip('/')}/metadata").first()
    return str(json.loads(metadata[0])["id"]) if metadata else None


def check(conn: psycopg.Connection, st: Statements, query: str | None, batch: int) -> None:
    """Raise SINK_BATCH_LOST where the database no longer shows the batch of `query` before `batch`.

    The driver asks before a batch; each task asks again in its own transaction, before it
    commits: the database can go back between the two (the tasks wait on a lock, a crash takes
    the batch before), and a task starting over on the server that came back would move the
    ledger on past the lost batch's events, which then no remedy reads again.
    """
    if query is None:
        return
    row = conn.execute(st.last_batch(), {"sink": st.spec.name, "query": query}).fetchone()
    gone = lost(row[0] if row else None, query, batch)
    if gone:
        ledger = positions(conn, st.spec.ledger_schema, st.spec.name)
        raise lost_batches(st.spec.name, gone, batch, ledger, None if row else query)


def lost_batches(
    sink: str, gone: range, batch: int, ledger: Positions, unknown: str | None = None
) -> OutboxError:
    """The one line for a database that went back: what is missing and how to read it again.

    unknown: the query, where the database holds no batch of it at all: then its checkpoint may
    also be one moved onto the sink, which adopting it says."""
    first, last = gone[0], gone[-1]
    which = f"batch {first}" if first == last else f"batches {first}-{last}"
    moved = ""
    if unknown is not None:
        which += " of this query, which it holds no batch of"
        moved = (
            ". If this checkpoint was never this sink's (moved onto it, or the sink added to a running"
            f" query), record it instead: outbox sinks adopt {sink} --query {unknown} --batch {last}"
        )
    offsets = json.dumps(to_offsets(ledger), separators=(",", ":"))
    return error("SINK_BATCH_LOST", sink=sink, which=which, batch=batch, offsets=offsets, moved=moved)
