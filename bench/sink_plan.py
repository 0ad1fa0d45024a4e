"""The sink bench's plan: the events' schema and tables, the runs that write, and the rounds and order
the compared runs are measured in."""

from __future__ import annotations

import pyarrow as pa

SCHEMA = "event_id string, n long, amount decimal(12,2), note string"
ARROW_SCHEMA = pa.schema(
    [("event_id", pa.string()), ("n", pa.int64()), ("amount", pa.decimal128(12, 2)), ("note", pa.string())]
)
RANGES = "topic string, partition int, start long, end long"
TABLE = "CREATE TABLE {} (event_id uuid PRIMARY KEY, n bigint, amount numeric(12,2), note text)"
# The Spark runs that write, each to bench_<name>.
SINKS = ("sink", "sink_memory", "sink_rc", "sink_driver", "sink_traced", "sink_rf3", "sink_avro")
WRITERS = (
    "sink",
    "jdbc",
    "hand",
    "sink_memory",
    "jdbc_memory",
    "hand_memory",
    "jdbc_memory_ranged",
    "hand_memory_ranged",
    "sink_rc",
    "sink_driver",
    "sink_traced",
    "sink_rf3",
    "tasks_read_kafka",
    "sink_avro",
    "jdbc_avro",
    "hand_avro",
)
# The runs the targets compare, measured in --rounds rounds, by feed: the feed handed to Python as Arrow,
# then the writers of that feed, whose order turns by one each round. A round ran them in one order
# before, the sink first: in three one-round runs it cost 5-10 CPU us per event more in the Spark JVM
# than the same sink run later (tracing, on the driver), and in two kept runs of three its first
# round's ratio was the lowest; now each writer's place turns by one each round. The traced sink sat
# last, so that in four rounds of five it ran just before the untraced one, which then ran faster:
# 2026-11-29T051651Z-sink.json gave 1.1 the round it ran after it, 0.85-0.90 in the four others, while
# its tasks' stages were no slower. Two places apart, it runs first in two rounds of five, second in three.
COMPARED = (
    ("source_arrow", ("sink", "jdbc", "sink_traced", "hand", "tasks_read_kafka")),
    (
        "source_memory_arrow",
        ("sink_memory", "jdbc_memory", "hand_memory", "jdbc_memory_ranged", "hand_memory_ranged"),
    ),
    ("source_avro_arrow", ("sink_avro", "jdbc_avro", "hand_avro")),
)
ROUNDED = tuple(name for feed, writers in COMPARED for name in (feed, *writers))
# Each writer from Kafka runs once unmeasured first (the JVMs' first reads).
WARMED = (*COMPARED[0][1], *COMPARED[2][1])
# The Avro events' schema: SCHEMA's columns, as a producer with Confluent's serializer writes them.
AVRO_SCHEMA = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "note", "type": "string"},
    ],
}


def round_order(k: int, avro: bool = True) -> list[str]:
    """Round k's (from 0) runs: each feed, then its writers turned by k."""
    return [
        name
        for feed, writers in COMPARED
        if avro or feed != "source_avro_arrow"
        for name in (feed, *writers[k % len(writers) :], *writers[: k % len(writers)])
    ]
