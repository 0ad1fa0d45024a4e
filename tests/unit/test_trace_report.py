"""`outbox trace`'s ids and lines, from plain values."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.errors import ConfigError
from outbox.core.trace import outbox_event_id
from outbox.trace.gather import found_in_kafka, spellings
from outbox.trace.report import (
    Applied,
    DeadLetter,
    OutboxEvent,
    Position,
    Published,
    Trace,
    as_json,
    lines,
)

AT = datetime(2026, 11, 25, 12, 0, 1, 250000, tzinfo=UTC)


def test_a_uuid_is_looked_up_as_given_and_in_its_canonical_form() -> None:
    u = uuid.uuid4()
    assert spellings(str(u).upper()) == [str(u).upper(), str(u)]
    assert spellings(str(u)) == [str(u)]
    assert spellings("order-42") == ["order-42"]


def test_outbox_ids_differ_by_sink_transaction_round_key_and_table() -> None:
    parts = [
        ("s", "7", 0, "k", "public.orders"),
        ("s2", "7", 0, "k", "public.orders"),
        ("s", "8", 0, "k", "public.orders"),
        ("s", "7", 1, "k", "public.orders"),
        ("s", "7", 0, "K", "public.orders"),
        ("s", "7", 0, "k", "public.shipments"),  # a routed sink's two tables
        ("s", "7", 0, "k", None),  # a trace row of before the table was recorded
    ]
    assert len({outbox_event_id(*p) for p in parts}) == len(parts)


def test_the_lines_say_each_outcome_and_where_the_outbox_event_is() -> None:
    box = OutboxEvent(
        uuid.UUID(int=1), "out", "published", relay="outbox-relay.r.x.0-of-1", published=Published(2, 40, AT)
    )
    trace = Trace(
        "k",
        (
            Applied("s", "in", 0, 7, "applied", "3", AT, box),
            Applied("s", "in", 0, 9, "stale", "2", AT),
            Applied(
                "s",
                "in",
                0,
                11,
                "applied",
                None,
                AT,
                OutboxEvent(uuid.UUID(int=2), "out", "waiting", since=AT),
            ),
        ),
        (DeadLetter("s", "in", 0, 12, "null value", AT),),
    )
    said = lines(trace)
    assert said[0] == "event k: 3 input record(s), 1 dead letter(s)"
    assert said[1] == "  input in[0]@7: sink s applied at version 3, 2026-11-25 12:00:01.250Z"
    assert said[2] == (
        f"    outbox event {uuid.UUID(int=1)} for out: published as out[2]@40 at 2026-11-25 12:00:01.250Z"
        " by transactional.id outbox-relay.r.x.0-of-1"
    )
    assert said[3].startswith("  input in[0]@9: sink s skipped: a stale version")
    assert said[5].endswith(
        "waiting in the outbox since 2026-11-25 12:00:01.250Z: no relay has recorded publishing it"
    )
    assert said[6] == "  input in[0]@12: sink s dead-lettered it, 2026-11-25 12:00:01.250Z: null value"
    doc = json.loads(json.dumps(as_json(trace)))
    assert doc["found"] is True and doc["records"][0]["outbox"]["published"]["offset"] == 40


def test_nothing_found_says_where_it_looked() -> None:
    assert not Trace("k").found
    assert "no tracing sink (PostgresSink(trace=True)) applied it" in lines(Trace("k"))[0]


@given(
    topic=st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**63 - 1),
)
def test_any_kafka_position_is_read_back_from_topic_partition_offset(
    topic: str, partition: int, offset: int
) -> None:
    assert Position.parse(f"{topic}:{partition}:{offset}") == Position(topic, partition, offset)


@pytest.mark.parametrize("text", ["", "orders", "orders:1", "orders:-1:2", "orders:1:x", ":1:2", "a:1:2:3"])
def test_a_position_that_is_not_one_gets_one_line(text: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Position.parse(text)
    assert refused.value.code == "TRACE_AT_MALFORMED"


def test_a_trace_at_one_position_keeps_that_record_alone() -> None:
    trace = Trace(
        "k",
        (Applied("s", "in", 0, 7, "applied", "3", AT), Applied("s", "in", 1, 7, "stale", "2", AT)),
        (DeadLetter("s", "in", 0, 9, "bad", AT), DeadLetter("s", None, None, None, "bad", AT)),
    )
    assert trace.only(Position("in", 1, 7)).records == (trace.records[1],)
    assert trace.only(Position("in", 1, 7)).dead_letters == ()
    assert trace.only(Position("in", 0, 9)).dead_letters == (trace.dead_letters[0],)
    nowhere = trace.only(Position("other", 0, 7))
    assert not nowhere.found
    assert lines(nowhere) == [
        "event k: no record of it at other[0]@7: no tracing sink (PostgresSink(trace=True)) applied it,"
        " and no sink dead letter holds it"
    ]


def test_kafka_has_the_last_word_on_what_was_published() -> None:
    """A relay records how far it got in PostgreSQL about once a second: one killed -9 in between
    published more than PostgreSQL says."""
    waiting = OutboxEvent(uuid.UUID(int=1), "out", "waiting", since=AT)
    said_published = OutboxEvent(uuid.UUID(int=2), "out", "published", relay="r")
    lost = OutboxEvent(uuid.UUID(int=3), "out", "published", relay="r")
    boxes = [waiting, said_published, lost]
    trace = Trace("k", tuple(Applied("s", "in", 0, n, "applied", None, AT, b) for n, b in enumerate(boxes)))
    here = {uuid.UUID(int=1): Published(0, 5, AT), uuid.UUID(int=2): Published(1, 6, AT)}
    found = found_in_kafka(trace, here)
    assert [(r.outbox.state, r.outbox.published, r.outbox.since) for r in found.records if r.outbox] == [
        ("published", here[uuid.UUID(int=1)], None),
        ("published", here[uuid.UUID(int=2)], None),
        ("published", None, None),
    ]
    assert found.searched is not None and found.searched.startswith("1 published event(s) not found in Kafka")
    assert found_in_kafka(trace, {}).records[0].outbox == waiting, "not found: as PostgreSQL says"
