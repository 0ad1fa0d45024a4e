"""The embedded Apache Kafka broker behaves as a real one: durable, and it expires what a crash leaves."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from outbox.core.kafka import client_settings
from outbox_dev.kafka import Broker
from tests.helpers import (
    Job,
    create_topic,
    produce_transaction,
    read_committed,
    transactional_producer,
    unique,
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill-9"])
def test_committed_records_survive_a_restart(own_broker: Broker, sig: int) -> None:
    name = create_topic(own_broker.bootstrap, unique("durable"), partitions=2)
    producer = transactional_producer(own_broker.bootstrap)
    produce_transaction(producer, name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)])
    produce_transaction(producer, name, [(b"k", b"aborted")], commit=False)
    before = sorted(read_committed(own_broker.bootstrap, name, 2))
    own_broker.restart(sig)
    assert len(before) == 50
    assert sorted(read_committed(own_broker.bootstrap, name, 2)) == before


GROUP_MEMBER = """
import sys
from confluent_kafka import Consumer
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[3],
                     "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
consumer.subscribe([sys.argv[2]])
while True:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        print("consumed", flush=True)
"""


def test_a_killed_group_member_stops_blocking_its_group_after_its_session_timeout(
    bootstrap: str, tmp_path: Path
) -> None:
    """No group.instance.id: once the broker expires the dead member's session, the group rebalances."""
    name = create_topic(bootstrap, unique("group"), partitions=1)
    group = unique("group")
    produce_transaction(transactional_producer(bootstrap), name, [(b"k", b"v")])
    member = Job(["-c", GROUP_MEMBER, bootstrap, name, group], tmp_path / "member.log", {})
    member.wait_for_output("consumed", 60)
    member.kill9()

    consumer = Consumer(
        client_settings(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "session.timeout.ms": 6000,
                "auto.offset.reset": "earliest",
            },
            "consumer",
        )
    )
    try:
        consumer.subscribe([name])
        deadline = time.monotonic() + 60
        got = None
        while got is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got = message.value()
        assert got == b"v", "the dead member still holds the partition"
        assert consumer.assignment(), "never assigned"
    finally:
        consumer.close()


def test_kafka_cluster_ids_are_kafka_uuids_and_never_look_like_options() -> None:
    import base64

    from outbox_dev.kafka import cluster_id

    ids = [cluster_id() for _ in range(2000)]  # about 1 in 64 would start with "-" unless refused
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
