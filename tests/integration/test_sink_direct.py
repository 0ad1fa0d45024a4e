"""The tasks that read Kafka themselves (sinks/postgres/direct.py) against Spark's own parse.

Where the tasks parse a range's values with Arrow, each row they stage must be
the row Spark's parse_json and the sink's columns give; where they cannot be
sure, they must decline (Spark's rows are applied instead). Checked for every
input hypothesis finds, adversarial ones first, with a real SparkSession.
"""

from __future__ import annotations

import contextlib
import json
import logging
from decimal import Decimal
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from outbox.core.config import DatabaseUrl
from sinks.kafka_source.reader import ARROW_SCHEMA
from sinks.postgres import Outbox, PostgresSink, parse_json
from sinks.postgres.direct import Declined, parse_for, staged, values_of, why_not
from sinks.postgres.placement import Node, Route
from sinks.postgres.plan import Plan
from sinks.postgres.sink import _delete_rule, staged_columns
from tests.helpers import create_topic, produce_transaction, transactional_producer, unique
from tests.sink_support import KAFKA, check_exactly_once, check_with_console, produce_orders, run
from tests.source_support import stream

pytestmark = pytest.mark.timeout(600)

SCHEMA = "id string, n long, i int, amount decimal(12,2), x double, ok boolean"
FIELDS = ("id", "n", "i", "amount", "x", "ok")
WRITTEN = (*FIELDS, "topic", "partition", "offset")
PLAN = Plan(
    columns=WRITTEN,
    conversions=dict.fromkeys(WRITTEN, "native"),
    raw_key="key",
    raw_value="value",
    error="_error",
    no_equality=frozenset(),
)
Record = tuple[bytes | None, bytes | None]

# Values that Spark and Arrow read apart, or that crashed Arrow's reader: each must be declined or agree.
ADVERSARIAL: list[bytes | None] = [
    None,
    b"",
    b" ",
    b"null",
    b"[]",
    b'"x"',
    b"{}",
    b'{"id": "a"} {"id": "b"}',
    b'{"id": "a"} null',
    b'{"id": "a"}\n',
    b'{"id":\n"a"}',
    b"{'id': 'a'}",
    b'{"x": NaN}',
    b'{"x": "NaN"}',
    b'{"x": -0}',
    b'{"x": -0.0}',
    b'{"x": 1e400}',
    b'{"x": 1e-400}',
    b'{"n": 1.0}',
    b'{"n": "1"}',
    b'{"n": 9223372036854775808}',
    b'{"i": 2147483648}',
    b'{"amount": 1.234}',
    b'{"amount": 12345678901.5}',
    b'{"amount": 9999999999.99}',
    b'{"amount": "1.2"}',
    b'{"amount": "1,000.5"}',
    b'{"amount": 1e2}',
    b'{"id": 1}',
    b'{"id": {"a": 1}}',
    b'{"id": "a", "id": "b"}',
    b'{"ID": "a"}',
    b'{"\\u0069d": "a"}',
    b'{"id": "\\ud800"}',
    b'{"id": "a\tb"}',
    b'{"id": "\\u0000"}',
    b'{"id": "\xff"}',
    b'\xef\xbb\xbf{"id": "a"}',
    b'{"_corrupt_record": "x", "id": "a"}',
    b'{"ok": 1}',
    b'{"ok": "true"}',
    b'{"id": "a",}',
    b'{"id": "a"} // c',
    b'{"other": [1, {"y": "z"}], "id": "a"}',
    b'  {"id": "a", "n": -0, "i": 7, "amount": 1.2, "x": 0.1, "ok": true}  ',
    b'{"x": Inf}',
    b'{"x": -Infinity}',
    b'{"other": Inf, "id": "a"}',
    b'{"other": [NaN], "id": "a"}',
    b'{"id": "ratio: Inf"}',
    b'{"other": ' + b"[" * 1200 + b"]" * 1200 + b', "id": "a"}',
    b'{"other": 1' + b"0" * 1200 + b', "id": "a"}',
    b'{"other": "' + b"y" * 60_000 + b'", "id": "a"}',
    b'{"id": "' + b"y" * 2_000 + b'"}',
]


def spark_rows(spark, ranges: list[list[Record]]) -> list[list[dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """What the sink's tasks get from Spark for each range: parse_json, then the staged columns.

    All ranges in one Spark job, each from offset 0: both steps are row by row, and a job costs
    Spark a second of planning however few its rows (one job a range took the tests minutes)."""
    rows = [(k, v, "t", 0, o) for records in ranges for o, (k, v) in enumerate(records)]
    frame = parse_json(spark.createDataFrame(rows, KAFKA), SCHEMA, key_column="id")
    got = frame.select(*staged_columns(PLAN, _delete_rule("tombstone", PLAN))).toArrow().to_pylist()
    ends = list(accumulate(len(records) for records in ranges))
    return [got[end - len(records) : end] for records, end in zip(ranges, ends, strict=True)]


@cache
def values_parsed(spark):  # type: ignore[no-untyped-def]
    """What the tasks know of parse_json's frame: asked of Spark once, as a sink asks once a query."""
    values = values_of(parse_json(spark.createDataFrame([], KAFKA), SCHEMA, key_column="id"))
    assert values is not None
    return values


def direct_rows(spark, records: list[Record]) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    values = values_parsed(spark)
    table = pa.Table.from_pylist(
        [
            {"key": k, "value": v, "topic": "t", "partition": 0, "offset": o}
            for o, (k, v) in enumerate(records)
        ],
        ARROW_SCHEMA,  # what the tasks read: the reader's columns, those not given null
    )
    return pa.Table.from_batches([staged(table, parse_for(values, PLAN, "tombstone"))]).to_pylist()


def staged_or_declined(spark, ranges: list[list[Record]]) -> list[bool]:  # type: ignore[no-untyped-def]
    """For each range, True if the tasks staged it, as Spark's rows; False if they declined it.

    Only the ranges the tasks staged go to Spark, as in the sink."""
    ours = {}
    for i, records in enumerate(ranges):
        with contextlib.suppress(Declined):
            ours[i] = direct_rows(spark, records)
    theirs = spark_rows(spark, [ranges[i] for i in ours]) if ours else []
    for (i, rows), spark_side in zip(ours.items(), theirs, strict=True):
        assert exact(rows) == exact(spark_side), f"records {ranges[i]!r}"
    return [i in ours for i in range(len(ranges))]


def same_or_declined(spark, records: list[Record]) -> bool:  # type: ignore[no-untyped-def]
    """True if the tasks staged these records, which then equal Spark's; False if they declined."""
    return staged_or_declined(spark, [records])[0]


def exact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with their floats by their bits: NaN equals NaN, and -0.0 is no 0.0."""
    return [{k: v.hex() if isinstance(v, float) else v for k, v in row.items()} for row in rows]


def test_each_adversarial_value_alone_is_read_as_spark_reads_it_or_declined(spark) -> None:  # type: ignore[no-untyped-def]
    staged = staged_or_declined(spark, [[(b"k", v)] for v in ADVERSARIAL])
    read = [v for v, yes in zip(ADVERSARIAL, staged, strict=True) if yes]
    # Not every value may be declined: the test would then prove nothing of the rows staged.
    long_text = b'{"id": "' + b"y" * 2_000 + b'"}'
    assert {None, b"{}", b'{"x": 1e-400}', b'{"amount": 1e2}', long_text} <= set(read), read
    assert b'{"id": "a"} {"id": "b"}' not in read  # two JSON texts: Arrow makes two rows of it


def test_a_range_with_one_value_the_tasks_cannot_vouch_for_is_declined_whole(spark) -> None:  # type: ignore[no-untyped-def]
    good = [(b"a", b'{"id": "a", "n": 1}'), (b"b", None), (b"c", b'{"id": "c", "n": 3}')]
    assert same_or_declined(spark, good)
    assert not same_or_declined(spark, [*good, (b"d", b'{"x": -0}')])


def test_a_tombstone_takes_its_key_column_from_its_kafka_key_as_spark_does(spark) -> None:  # type: ignore[no-untyped-def]
    rows = direct_rows(spark, [(b"gone", None), (None, None), (b"k", b'{"id": "kept"}')])
    assert [(r["c0"], r["_delete"]) for r in rows] == [("gone", True), (None, True), ("kept", False)]
    assert same_or_declined(spark, [(b"gone", None), (None, None), (b"k", b'{"id": "kept"}')])
    assert not same_or_declined(spark, [(b"\xff", None)])  # a key that is not UTF-8: Spark's to judge


def json_value(value: Any) -> st.SearchStrategy[bytes]:
    return st.just(json.dumps(value).encode())


FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.none(), st.text(), st.integers()),
        "n": st.one_of(st.none(), st.integers(min_value=-(2**64), max_value=2**64), st.floats()),
        "i": st.one_of(st.none(), st.integers(min_value=-(2**32), max_value=2**32)),
        "amount": st.one_of(
            st.none(),
            st.decimals(allow_nan=False, allow_infinity=False, places=3).map(float),
            st.decimals(min_value=Decimal(-(10**11)), max_value=Decimal(10**11), places=2).map(str),
        ),
        "x": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.integers()),
        "ok": st.one_of(st.none(), st.booleans(), st.integers(0, 1)),
        "extra": st.recursive(
            st.none() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
        ),
    },
)
VALUES = st.one_of(
    FIELD_VALUES.flatmap(json_value),
    FIELD_VALUES.map(lambda d: json.dumps(d, ensure_ascii=False).encode()),
    FIELD_VALUES.map(lambda d: json.dumps(d, indent=1).encode()),
    st.sampled_from([v for v in ADVERSARIAL if v is not None]),
    st.binary(max_size=20),
    st.none(),
)
KEYS = st.one_of(st.none(), st.binary(max_size=8), st.text(max_size=8).map(str.encode))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=6))
@example([(b"k", b'{"id": "a", "n": 1, "i": 2, "amount": 3.5, "x": 1e-7, "ok": false}')])
def test_every_range_the_tasks_stage_is_staged_as_spark_stages_it(spark, records: list[Record]) -> None:  # type: ignore[no-untyped-def]
    # Each record alone too: a range of one record declines only for its own sake.
    staged_or_declined(spark, [records, *([record] for record in records)])


def test_frames_the_tasks_cannot_read_say_why(spark, bootstrap) -> None:  # type: ignore[no-untyped-def]
    raw = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", "t")
    )
    source = Node("StreamingRelationV2", source="kafka")
    tasks = Route(True, "each task reads whole topic-partitions from kafka")
    frame = parse_json(raw.load(), SCHEMA)

    def why(frame, delete="tombstone", route=tasks, plan=PLAN, connect=False):  # type: ignore[no-untyped-def]
        return why_not(values_of(frame), plan, delete, route, source, connect)

    assert why(frame) is None
    assert "not a parse_*'s own" in str(why(frame.withColumn("n", F.col("n") + 1)))
    assert "Spark Connect" in str(why(frame, connect=True))
    assert "expression" in str(why(frame, delete="n < 0"))
    assert "expression" in str(why(frame, delete=F.col("value").isNull()))  # a Column: no truth value
    assert why(frame, delete=None) is None
    assert "driver" in str(why(frame, route=Route(False, "staged on the driver")))
    assert "options" in str(why(parse_json(raw.load(), SCHEMA, options={"allowComments": "true"})))
    assert "tombstone's key" in str(why(parse_json(raw.load(), SCHEMA, key_column="n")))
    assert "tombstone's key" in str(why(parse_json(raw.load(), SCHEMA, key_column="id", key_format="json")))
    timed = parse_json(raw.load(), "id string, at timestamp")
    timed_plan = Plan(("id", "at"), {"id": "native", "at": "native"}, "key", "value", "_error", frozenset())
    assert "at" in str(why(timed, plan=timed_plan))
    hexed = Plan(("id", "key"), {"id": "native", "key": "hex"}, "key", "value", "_error", frozenset())
    assert "key" in str(why(frame, plan=hexed))


@pytest.mark.parametrize("source", ["kafka", "kafka_rc"])
def test_a_stream_the_tasks_read_applies_a_range_they_decline_from_sparks_rows(  # type: ignore[no-untyped-def]
    spark, bootstrap: str, db: DatabaseUrl, pg, tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str
) -> None:
    """Committed, aborted and redelivered events read by the tasks; one value that is no JSON declines
    its partition's range, which Spark's rows then apply: its dead letter says what parse_json says."""
    topic = create_topic(bootstrap, unique("direct"), partitions=2)
    expected = produce_orders(bootstrap, topic, 600)
    produce_transaction(transactional_producer(bootstrap), topic, [(b"p0", b"{not json")])
    sink = PostgresSink("orders", url=db.raw, outbox=Outbox(topic="out", key="written.event_id::text"))
    with caplog.at_level(logging.INFO, logger="sinks.postgres"):
        run(spark, bootstrap, topic, tmp_path / "checkpoint", sink, source=source)
    assert "its tasks read the batches' Kafka records themselves" in caplog.text
    # kafka_rc packs a small topic's two ranges into one task (minRecordsPerTask): both are declined.
    declined = "1 of 2" if source == "kafka" else "2 of 2"
    assert f"{declined} topic-partitions applied from Spark's rows, not read by the tasks" in caplog.text
    check_exactly_once(pg, bootstrap, topic, expected, dead=1)
    check_with_console(pg, bootstrap, topic, dead=1)
    assert pg.execute("SELECT value, error FROM sink_dead_letters").fetchone() == (
        b"{not json",
        "the value is not a JSON object of the schema",
    )
    frame = parse_json(
        stream(spark, bootstrap, topic, source), "event_id string, n long", key_column="event_id"
    )
    assert PostgresSink("orders", url=db.raw, read_kafka=False).writer(frame).reads_kafka is None
