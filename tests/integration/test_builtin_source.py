"""kafka_rc beside Spark's own Kafka source (`format("kafka")`, read_committed), into PostgresSink.

The same input, with aborted transactions and redelivered events, must give
the same table through either source; and the sink's ledger must turn a
replay from `earliest` after a lost checkpoint into no-ops whichever source
feeds it.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from outbox.core.errors import ConfigError
from sinks.postgres import Outbox, PostgresSink, parse_json
from tests.helpers import produce_transaction, transactional_producer
from tests.sink_support import ORDERS, SCHEMA, event, ledger, log_ends, run, table


def test_both_sources_give_the_same_table(spark, bootstrap, topic, db, pg, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(60)]
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [event(i, n) for n, i in enumerate(ids[:40])])
    produce_transaction(producer, topic, [event(i, -1, "6.66") for i in ids], commit=False)
    produce_transaction(producer, topic, [event(i, n) for n, i in enumerate(ids[:10])])  # redelivered
    produce_transaction(producer, topic, [event(i, n, "2.50") for n, i in enumerate(ids[40:], 40)])
    produce_transaction(producer, topic, [event(ids[0], 0, "9.99")])  # an edit
    pg.execute(ORDERS.replace("orders", "orders_builtin"))

    run(
        spark, bootstrap, topic, tmp_path / "rc", PostgresSink("orders", url=db.raw), maxOffsetsPerTrigger="7"
    )
    builtin = PostgresSink("orders_builtin", url=db.raw)
    run(spark, bootstrap, topic, tmp_path / "builtin", builtin, source="kafka", maxOffsetsPerTrigger="7")

    expected = {i: (n, Decimal("1.00") if n < 40 else Decimal("2.50"), None) for n, i in enumerate(ids)}
    expected[ids[0]] = (0, Decimal("9.99"), None)
    assert table(pg) == expected
    assert table(pg, "orders_builtin") == expected


def test_a_lost_checkpoint_with_the_builtin_source_from_earliest_skips_what_was_applied(
    spark, bootstrap, topic, db, pg, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    ids = [str(uuid.uuid4()) for _ in range(30)]
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [event(i, n) for n, i in enumerate(ids[:20])])
    produce_transaction(producer, topic, [event(i, n, "5.00") for n, i in enumerate(ids[:5])])  # edits
    sink = PostgresSink(
        "orders", url=db.raw, outbox=Outbox(topic="orders.changed", key="written.event_id::text")
    )
    run(spark, bootstrap, topic, tmp_path / "first", sink, source="kafka")
    produce_transaction(producer, topic, [event(i, n) for n, i in enumerate(ids[20:], 20)])

    # Checkpoint lost: the builtin source replays everything from earliest, a few offsets
    # per batch, so without the ledger the old 1.00 versions would overwrite the 5.00
    # edits in their own batches and emit outbox events for each.
    run(spark, bootstrap, topic, tmp_path / "second", sink, source="kafka", maxOffsetsPerTrigger="3")

    expected = {i: (n, Decimal("5.00") if n < 5 else Decimal("1.00"), None) for n, i in enumerate(ids)}
    assert table(pg) == expected
    # One outbox event per change: 20 inserts, 5 edits, 10 inserts; the replay added none
    # (without the ledger it would add 10: each old 1.00 again, then each 5.00).
    assert pg.execute("SELECT count(*) FROM outbox_events").fetchone() == (35,)
    assert ledger(pg) == log_ends(bootstrap, topic)


def test_spark_source_left_at_its_default_isolation_is_refused_before_it_applies_aborted_records(
    spark, bootstrap, topic, db, pg, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Spark's own Kafka source reads read_uncommitted unless told: the records of aborted
    transactions, applied as events. The sink refuses such a frame at start; one that says
    read_uncommitted itself is the user's choice, and taken."""
    producer = transactional_producer(bootstrap)
    produce_transaction(producer, topic, [event(str(uuid.uuid4()), 1)], commit=False)

    def kafka(format: str = "kafka", **options: str):  # type: ignore[no-untyped-def]  # a reader each
        reader = spark.readStream.format(format).option("kafka.bootstrap.servers", bootstrap)
        return (
            reader.option("subscribe", topic).option("startingOffsets", "earliest").options(**options).load()
        )

    sink = PostgresSink("orders", url=db.raw)
    committed = kafka(**{"kafka.isolation.level": "read_committed"})
    # Alone, a union's second source, or named in another case or by its provider's class, which
    # Spark takes (the plan keeps the name as written: such a frame passed every check of a Kafka
    # source, this one included).
    provider = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
    for unset in (kafka(), committed.unionByName(kafka()), kafka("Kafka"), kafka(provider)):
        with pytest.raises(ConfigError) as caught:
            sink.writer(parse_json(unset, SCHEMA, key_column="event_id"))
        assert caught.value.code == "SINK_ISOLATION_UNSET", caught.value
        assert "kafka.isolation.level" in str(caught.value)
    chosen = kafka(**{"kafka.isolation.level": "read_uncommitted"})
    sink.writer(parse_json(chosen, SCHEMA, key_column="event_id"))  # taken: raises nothing
