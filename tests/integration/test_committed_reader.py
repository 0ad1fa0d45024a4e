"""The one-shot committed reader (`outbox verify`, `outbox trace`, the relay's positions, the tests'
checks) reads to the high watermark seen when it starts: a record committed behind another
producer's open transaction is waited for, never silently left out."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from outbox.core.committed import read_committed
from outbox.errors import ServiceUnavailable
from tests.helpers import create_topic, produce_transaction, transactional_producer, unique


def open_then_committed(bootstrap: str, topic: str):  # type: ignore[no-untyped-def]
    """One producer's transaction left open on partition 0, then three records committed after it."""
    stuck = transactional_producer(bootstrap)
    stuck.begin_transaction()
    stuck.produce(topic, value=b"open", partition=0)
    stuck.flush(30)
    committed = [(None, b"c0"), (None, b"c1"), (None, b"c2")]
    produce_transaction(transactional_producer(bootstrap), topic, committed, partition=0)
    return stuck


def test_committed_records_behind_an_open_transaction_are_waited_for_not_left_out(bootstrap: str) -> None:
    topic = create_topic(bootstrap, unique("behind"), 1)
    stuck = open_then_committed(bootstrap, topic)
    at = time.monotonic()
    with pytest.raises(ServiceUnavailable) as raised:
        read_committed({"bootstrap.servers": bootstrap}, topic, timeout=3)
    assert raised.value.code == "KAFKA_READ_TIMEOUT", raised.value
    assert "partition 0 at offset" in str(raised.value) and "of 5" in str(raised.value), raised.value
    assert time.monotonic() - at >= 3
    stuck.abort_transaction(30)


def test_a_read_waiting_behind_an_open_transaction_gets_every_record_once_it_ends(bootstrap: str) -> None:
    topic = create_topic(bootstrap, unique("behind"), 1)
    stuck = open_then_committed(bootstrap, topic)
    with ThreadPoolExecutor(1) as pool:
        read = pool.submit(read_committed, {"bootstrap.servers": bootstrap}, topic, timeout=60)
        time.sleep(2)
        assert not read.done()
        stuck.abort_transaction(30)
        assert [m.value() for m in read.result()] == [b"c0", b"c1", b"c2"]
