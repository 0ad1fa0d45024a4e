"""`outbox sinks adopt`: a checkpoint that was never a sink's, refused as lost until adopted."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from pyspark.errors import StreamingQueryException

from outbox.core.config import DatabaseUrl
from sinks.postgres import PostgresSink
from tests.cli import assert_one_line_error, outbox
from tests.helpers import produce_transaction, transactional_producer
from tests.sink_support import event, run, table

pytestmark = pytest.mark.timeout(300)


def test_a_checkpoint_moved_onto_a_sink_is_refused_until_adopted(  # type: ignore[no-untyped-def]
    spark, bootstrap: str, topic: str, db: DatabaseUrl, pg: psycopg.Connection, tmp_path: Path
) -> None:
    """A running query's sink renamed (a sink added to a running query looks the same): the new name
    holds no batch of the query, which may as well be a restore's loss, so it is refused until the
    user says which; adopted, its next batch is applied."""
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [event(str(uuid.uuid4()), n) for n in range(20)], partition=0)
    checkpoint = tmp_path / "checkpoint"
    run(spark, bootstrap, topic, checkpoint, PostgresSink("orders", url=db.raw, name="before"))
    produce_transaction(producer, topic, [event(str(uuid.uuid4()), n) for n in range(10)], partition=0)

    def renamed() -> PostgresSink:
        return run(spark, bootstrap, topic, checkpoint, PostgresSink("orders", url=db.raw, name="after"))

    with pytest.raises(StreamingQueryException, match=r"\[SINK_BATCH_LOST\]") as refused:
        renamed()
    assert "no longer holds batch 0 of this query" in str(refused.value)
    assert len(table(pg)) == 20
    env = {"DATABASE_URL": db.raw}
    adopted = outbox("sinks", "adopt", "after", "--checkpoint", str(checkpoint), env=env)
    assert adopted.code == 0 and "now holds query" in adopted.out and "at batch 0" in adopted.out, adopted
    assert f"outbox sinks adopt after --query {adopted.out.split('query ')[1].split()[0]} --batch 0" in str(
        refused.value
    )
    again = outbox("sinks", "adopt", "after", "--checkpoint", str(checkpoint), env=env)
    assert again.code == 0 and "already holds" in again.out, again

    renamed()
    assert len(table(pg)) == 30


def test_adopt_without_a_readable_checkpoint_or_a_query_and_batch_says_what_to_give(
    db: DatabaseUrl, tmp_path: Path
) -> None:
    env = {"DATABASE_URL": db.raw}
    assert_one_line_error(
        outbox("sinks", "adopt", "s", env=env), "give --checkpoint DIR, or --query ID and --batch N"
    )
    assert_one_line_error(outbox("sinks", "adopt", "s", "--query", "q", env=env), "--batch N")
    assert_one_line_error(
        outbox("sinks", "adopt", "s", "--checkpoint", str(tmp_path / "none"), env=env),
        f"checkpoint {tmp_path / 'none'}:",
        "give --query and --batch instead",
    )
    done = outbox("sinks", "adopt", "s", "--query", "q", "--batch", "4", env=env)
    assert done.code == 0 and "now holds query q at batch 4" in done.out, done
