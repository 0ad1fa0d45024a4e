"""The relay and the sink on a Kafka that authorises its clients by ACLs, as production clusters do.

The broker's SASL listener lets the user under test do only what ACLs grant;
the tests' own admin, producers and readers use its plain listener. With the
grants docs/relay.md lists (`outbox.relay.acls`) and nothing more, the relay
publishes every event once; with any one of them missing it stops with one
line that holds the kafka-acls command adding it. The sink applies every
committed event once with Read on its topic and no other grant.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from outbox.core.committed import read_committed
from outbox.core.config import DatabaseUrl
from outbox.relay.acls import TOPIC, TRANSACTIONAL_ID, Grant, events_topic, grants
from outbox.writer import add_event
from outbox_dev.kafka import Broker
from sinks.postgres import PostgresSink
from tests.helpers import create_topic, produce_transaction, transactional_producer, unique, wait_for
from tests.relay_support import (
    ACTIVE,
    SHORT_HALT,
    Committed,
    check_two_readers,
    relay_job,
    terminate,
    wait_published,
)
from tests.sink_support import check_with_console, event, ledger, log_ends, run
from tests.source_support import batch_read

USER, PASSWORD = "relay", "relay-s3cret"
PRINCIPAL = f"User:{USER}"
_RESOURCES = {
    TOPIC: ResourceType.TOPIC,
    TRANSACTIONAL_ID: ResourceType.TRANSACTIONAL_ID,
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("secured"), users={USER: PASSWORD})
    yield broker
    broker.stop()


def bindings(grant: Grant) -> list[AclBinding]:
    pattern = ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL
    return [
        AclBinding(
            _RESOURCES[grant.resource],
            grant.name,
            pattern,
            PRINCIPAL,
            "*",
            AclOperation[_snake(operation)],
            AclPermissionType.ALLOW,
        )
        for operation in grant.operations
    ]


def _snake(operation: str) -> str:
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()


def set_acls(broker: Broker, wanted: list[Grant]) -> None:
    """The relay's user may do what `wanted` grants, and nothing else, once this returns.

    Only the bindings that change are deleted or created, so a grant kept is never briefly gone. A
    created ACL is acknowledged once the controller has it; the broker authorises from its own copy a
    moment later, so this waits until the broker describes exactly the wanted set."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    target = {b for g in wanted for b in bindings(g)}
    held = _described(admin)
    gone = [_exactly(b) for b in held - target]
    if gone:
        for future in admin.delete_acls(gone).values():
            future.result(30)
    if target - held:
        for future in admin.create_acls(list(target - held)).values():
            future.result(30)
    wait_for(lambda: _described(admin) == target, 30, "the broker to authorise by the ACLs just set")


def _described(admin: AdminClient) -> set[AclBinding]:
    """Every ACL binding of the user under test, as the broker answering describes it."""
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        PRINCIPAL,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return set(admin.describe_acls(everything).result(30))


def _exactly(binding: AclBinding) -> AclBindingFilter:
    b = binding
    return AclBindingFilter(
        b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type
    )


def relay_env(broker: Broker, url: DatabaseUrl, tmp_path: Path) -> tuple[dict[str, str], str]:
    """The relay's environment on the SASL listener, its settings in a file (no password on a command
    line), and the positions topic it is given."""
    assert broker.secured is not None
    client = broker.secured.client(USER)
    config = tmp_path / "kafka.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in client.items() if k != "bootstrap.servers"))
    positions = unique("positions")
    return {
        "DATABASE_URL": url.raw,
        "KAFKA_BOOTSTRAP_SERVERS": client["bootstrap.servers"],
        "OUTBOX_RELAY_KAFKA_CONFIG": str(config),
        "OUTBOX_RELAY_POSITIONS_TOPIC": positions,
    }, positions


def write_events(url: DatabaseUrl, topic: str, count: int) -> Committed:
    committed = Committed()
    with psycopg.connect(url.libpq) as conn:
        for n in range(count):
            key = f"k{n % 4}"
            committed.add(key, [str(add_event(conn, topic, {"n": n}, key=key))])
            conn.commit()
    return committed


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_the_grants_the_docs_list_are_all_a_relay_needs(
    tmp_path: Path, outbox_db: DatabaseUrl, secured: Broker, delivery: str
) -> None:
    env, positions = relay_env(secured, outbox_db, tmp_path)
    topic, name = create_topic(secured.bootstrap, unique("events"), 3), unique("relay")
    set_acls(
        secured, [*grants(name, positions, exactly_once=delivery == "exactly-once"), events_topic(topic)]
    )
    committed = write_events(outbox_db, topic, 30)
    job, _ = relay_job(tmp_path, env, name, "--delivery", delivery)
    job.wait_for_output(ACTIVE, 60)
    check_two_readers(secured.bootstrap, topic, 3, committed, outbox_db)
    assert terminate(job) == 0
    assert PASSWORD not in job.output()


@pytest.mark.parametrize("missing", ["positions topic", "create", "transactional id"])
def test_a_grant_missing_stops_the_relay_with_the_command_that_adds_it(
    tmp_path: Path, outbox_db: DatabaseUrl, secured: Broker, missing: str
) -> None:
    """Before, a grant missing was retried as an outage until RELAY_GAVE_UP (2.5 minutes by default),
    naming the broker's refusal at best, or a positions topic "with no leader"."""
    env, positions = relay_env(secured, outbox_db, tmp_path)
    topic, name = create_topic(secured.bootstrap, unique("events"), 3), unique("relay")
    needed = grants(name, positions)
    left_out = needed[["positions topic", "create", "transactional id"].index(missing)]
    set_acls(secured, [g for g in needed if g != left_out] + [events_topic(topic)])
    committed = write_events(outbox_db, topic, 10)
    job, _ = relay_job(tmp_path, env, name)
    assert job.wait(60) == 2, job.output()
    said = [line for line in job.output().splitlines() if line.startswith("outbox: error: ")]
    assert len(said) == 1 and "[RELAY_KAFKA_NOT_AUTHORIZED]" in said[0], job.output()
    assert left_out.command(env["KAFKA_BOOTSTRAP_SERVERS"], PRINCIPAL) in said[0], said
    assert "retrying" not in job.output(), job.output()

    set_acls(secured, [*needed, events_topic(topic)])  # the grant added: it goes on from there
    again, _ = relay_job(tmp_path, env, name)
    again.wait_for_output(ACTIVE, 60)
    check_two_readers(secured.bootstrap, topic, 3, committed, outbox_db)
    assert terminate(again) == 0


@pytest.mark.parametrize("granted", [(), ("Describe",)], ids=["nothing", "describe"])
def test_an_events_topic_the_relay_may_not_write_is_a_halt_naming_the_grant(
    tmp_path: Path, outbox_db: DatabaseUrl, secured: Broker, granted: tuple[str, ...]
) -> None:
    """Where the relay may not even see the topic, it said the topic does not exist; where it may see
    it but not write, it retried until RELAY_GAVE_UP, naming no topic."""
    env, positions = relay_env(secured, outbox_db, tmp_path)
    topic, name = create_topic(secured.bootstrap, unique("events"), 3), unique("relay")
    other = create_topic(secured.bootstrap, unique("other"), 3)
    partial = [Grant(TOPIC, topic, granted, "test")] if granted else []
    set_acls(secured, [*grants(name, positions), events_topic(other), *partial])
    before = write_events(outbox_db, other, 5)
    write_events(outbox_db, topic, 3)
    job, _ = relay_job(tmp_path, env, name)
    job.wait_for_output("halted on a poison row", 60)
    assert f"not authorized to write to topic {topic!r}" in job.output(), job.output()
    assert f"--operation Write --topic {topic}" in job.output(), job.output()
    check_two_readers(secured.bootstrap, other, 3, before, outbox_db)  # the rows before it, once
    assert job.process.poll() is None, job.output()
    assert terminate(job) == 0


def test_a_write_grant_revoked_while_it_runs_halts_on_the_topic_and_resumes_once_granted(
    tmp_path: Path, outbox_db: DatabaseUrl, secured: Broker
) -> None:
    """The transaction that meets the revoked grant fails as a whole, naming no topic: before, the relay
    retried it until RELAY_GAVE_UP. Now the rows before it are out, the topic is named, and once the
    grant is back every event goes out once."""
    env, positions = relay_env(secured, outbox_db, tmp_path)
    topic, name = create_topic(secured.bootstrap, unique("events"), 3), unique("relay")
    needed = [*grants(name, positions), events_topic(topic)]
    set_acls(secured, needed)
    committed = write_events(outbox_db, topic, 10)
    job, _ = relay_job(tmp_path, env, name, *SHORT_HALT)
    job.wait_for_output(ACTIVE, 60)
    wait_published(secured.bootstrap, topic, 3, committed.count)
    other = create_topic(secured.bootstrap, unique("other"), 3)
    set_acls(secured, [*needed[:-1], events_topic(other), Grant(TOPIC, topic, ("Describe",), "test")])
    before = write_events(outbox_db, other, 4)  # in the batch of the refused rows, ahead of them
    later = write_events(outbox_db, topic, 10)
    job.wait_for_output("halted on a poison row", 60)
    assert f"not authorized to write to topic {topic!r}" in job.output(), job.output()
    assert "RELAY_GAVE_UP" not in job.output()
    check_two_readers(secured.bootstrap, other, 3, before, outbox_db)
    set_acls(secured, [*needed, events_topic(other)])
    check_two_readers(secured.bootstrap, topic, 3, Committed.merged(committed, later), outbox_db, timeout=90)
    assert terminate(job) == 0


def test_the_sink_applies_every_event_once_with_read_on_its_topic_and_no_other_grant(
    spark, secured: Broker, db: DatabaseUrl, pg: psycopg.Connection, checkpoint: Path
) -> None:
    """kafka_rc reads as the user, and the sink's check of the topic's id and log ends asks as it: no
    group, no cluster grant. An aborted transaction in the topic, applied by neither."""
    assert secured.secured is not None
    client = secured.secured.client(USER)
    topic = create_topic(secured.bootstrap, unique("orders"), 2)
    producer = transactional_producer(secured.bootstrap)
    produce_transaction(producer, topic, [event(str(uuid.uuid4()), n) for n in range(40)])
    produce_transaction(producer, topic, [event(str(uuid.uuid4()), 99)], commit=False)
    set_acls(secured, [Grant(TOPIC, topic, ("Read",), "the sink's input")])
    options = {f"kafka.{k}": v for k, v in client.items() if k != "bootstrap.servers"}
    sink = run(
        spark, client["bootstrap.servers"], topic, checkpoint, PostgresSink("orders", url=db.raw), **options
    )
    assert sink.last is not None
    check_with_console(pg, secured.bootstrap, topic)
    assert ledger(pg) == log_ends(secured.bootstrap, topic)


def test_the_readers_need_no_grant_on_the_group_they_never_use(spark, secured: Broker) -> None:
    """librdkafka looks up the group of any consumer with a group.id, and a principal with no grant on
    it gets GROUP_AUTHORIZATION_FAILED as the consumer starts, though these readers only assign
    partitions. Before, kafka_rc's reads (KAFKA_RC_READ_FAILED) and the reader of the relay's positions
    and of `outbox verify` (KAFKA_READ_FAILED) failed on it whenever it came before the read's end."""
    assert secured.secured is not None
    client = secured.secured.client(USER)
    topic, count = create_topic(secured.bootstrap, unique("many"), 1), 100_000
    producer = Producer({"bootstrap.servers": secured.bootstrap, "linger.ms": 50})
    for n in range(count):
        producer.produce(topic, str(n).encode(), b"k")
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    set_acls(secured, [Grant(TOPIC, topic, ("Read",), "the readers' input")])
    assert len(read_committed(client, topic, timeout=120)) == count
    options = {f"kafka.{k}": v for k, v in client.items() if k != "bootstrap.servers"}
    assert len(batch_read(spark, client["bootstrap.servers"], topic, **options)) == count
