"""The relay on a three-broker cluster (RF 3, min.insync 2): what it keeps in Kafka outlives a broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from core.config import DatabaseUrl
from outbox.dev.kafka import Cluster
from outbox.relay.relay import POSITIONS_TOPIC
from tests.helpers import create_topic, unique
from tests.relay_support import (
    ACTIVE,
    Committed,
    Writers,
    assert_exactly_once,
    relay_job,
    terminate,
    wait_published,
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(tmp_path / "kafka", size=3)
    yield started
    started.close()


def test_the_positions_outlive_the_broker_that_led_them(
    tmp_path: Path, outbox_db: DatabaseUrl, cluster: Cluster
) -> None:
    """Created with the broker's default replication (1 on a stock broker), the positions died with
    their one broker, and the relay either stalled or published its outbox again."""
    bootstrap, name = cluster.bootstrap, unique("relay")
    topic = create_topic(bootstrap, unique("events"), partitions=3)
    env = {"DATABASE_URL": outbox_db.raw, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    first = Writers(outbox_db, topic).start(transactions=20)
    first.join()
    job, _ = relay_job(tmp_path, env, name, "--no-cleanup")  # every row stays, to be republished if lost
    assert_exactly_once(wait_published(bootstrap, topic, 3, first.committed.count), first.committed)
    assert terminate(job) == 0

    admin = AdminClient({"bootstrap.servers": bootstrap})
    [partition] = admin.list_topics(POSITIONS_TOPIC, timeout=30).topics[POSITIONS_TOPIC].partitions.values()
    resource = ConfigResource(ConfigResource.Type.TOPIC, POSITIONS_TOPIC)
    config = admin.describe_configs([resource])[resource].result(30)
    assert len(partition.replicas) == 3 and config["min.insync.replicas"].value == "2"
    cluster.kill(partition.leader)

    second = Writers(outbox_db, topic).start(transactions=20)
    second.join()
    job, _ = relay_job(tmp_path, env, name, "--no-cleanup")
    job.wait_for_output(ACTIVE, 120)
    committed = Committed.merged(first.committed, second.committed)
    assert_exactly_once(wait_published(bootstrap, topic, 3, committed.count, timeout=120), committed)
    assert terminate(job) == 0
