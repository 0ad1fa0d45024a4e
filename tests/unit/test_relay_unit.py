"""The relay's decisions and settings, without services."""

from __future__ import annotations

import itertools
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import BrokerMetadata, ClusterMetadata, PartitionMetadata, TopicMetadata
from hypothesis import given
from hypothesis import strategies as st

from outbox.cli.relay import kafka_settings, redacted
from outbox.core.errors import ConfigError, OutboxError
from outbox.relay import acls, pace
from outbox.relay.kafka import Publisher
from outbox.relay.poison import explain, is_poison, unpublishable
from outbox.relay.position import (
    Identity,
    Position,
    Shard,
    Step,
    Target,
    advance,
    latest_position,
    rows_before,
)
from outbox.relay.positions import answer, cluster_size, problems, refused, replication
from outbox.relay.relay import backoff
from outbox.relay.row import Row
from outbox.relay.settings import RelaySettings, relay_name
from outbox.relay.topics import risks
from tests.helpers import REPO

SNAP = "100:105:101,103"
TARGET = Target(SNAP, 7)  # a fresh delta's snapshot and the mark written for it
SYSTEM = "7311"


def test_a_short_fetch_finishes_the_delta() -> None:
    start = Position("90:90:", mark=6, system=SYSTEM)
    finished = Position(SNAP, mark=7, system=SYSTEM)
    assert advance(start, TARGET, [7, 9], limit=5) == Step(2, finished, persist=True)


def test_a_full_fetch_publishes_a_part_and_remembers_where_in_the_delta() -> None:
    step = advance(Position("90:90:"), TARGET, [7, 9, 12], limit=2)
    assert step == Step(2, Position("90:90:", SNAP, 9, mark=7), persist=True)
    # the next fetch continues inside the same delta and finishes it
    assert advance(step.position, TARGET, [12], limit=2) == Step(1, Position(SNAP, mark=7), persist=True)


def test_a_fetch_its_byte_budget_cut_publishes_what_it_read_and_stays_in_the_delta() -> None:
    step = advance(Position("90:90:"), TARGET, [7, 9], limit=5, cut=True)
    assert step == Step(2, Position("90:90:", SNAP, 9, mark=7), persist=True)
    # a row alone over the budget goes alone; a cut read that found nothing finishes the delta
    assert advance(step.position, TARGET, [12], limit=5, cut=True).position.after_id == 12
    assert advance(step.position, TARGET, [], limit=5, cut=True) == Step(
        0, Position(SNAP, mark=7), persist=False
    )


def test_an_empty_fetch_moves_the_base_without_a_transaction() -> None:
    unmarked = Target(SNAP, 6)  # an empty delta writes no mark: the last one still covers the base
    assert advance(Position("90:90:", mark=6), unmarked, [], limit=2) == Step(
        0, Position(SNAP, mark=6), persist=False
    )


A, B = "0b6b7c6e-aaaa-4d5e-9f00-000000000001", "0b6b7c6e-bbbb-4d5e-9f00-000000000002"


def record(relay: Identity, position: Position) -> tuple[bytes, bytes]:
    return relay.position_key, position.to_json(relay)


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50, unique=True), st.data())
def test_a_halt_publishes_exactly_the_rows_before_the_poison_row(ids: list[int], data) -> None:  # type: ignore[no-untyped-def]
    ids.sort()
    poison = data.draw(st.sampled_from(ids))
    start = Position("10:20:", "30:30:", 0, mark=3)
    count = rows_before(ids, poison)
    published = ids[:count]
    assert published == [i for i in ids if i < poison], "every row before the poison row, none after"
    if published:  # published as a batch of their own, the position inside the delta
        step = advance(start, Target("30:30:", 3), ids, count)
        assert step == Step(count, Position("10:20:", "30:30:", published[-1], 3), persist=True)


def test_position_round_trip_and_bad_records() -> None:
    position, relay = Position("90:90:", SNAP, 9, 12, SYSTEM), Identity("r", A, Shard(1, 4))
    assert Position.from_json(position.to_json(relay)) == (position, relay)
    # a record of a relay from before marks reads as one without mark and system
    old = b'{"relay":"r","outbox":"%s","shard":1,"shards":4,"base":"9:9:","target":null,"after_id":0}'
    old %= A.encode()
    assert Position.from_json(old) == (Position("9:9:"), relay)
    with pytest.raises(OutboxError) as unreadable:
        Position.from_json(b"{}")
    assert unreadable.value.code == "RELAY_POSITION_UNREADABLE"
    with pytest.raises(OutboxError) as malformed:
        Position.from_json(Position("x:y:").to_json(relay))
    assert malformed.value.code == "RELAY_POSITION_SNAPSHOT_MALFORMED"


def test_latest_position_is_the_last_of_this_relay_outbox_and_shard() -> None:
    mine, other_shard = Identity("r", A, Shard(0, 2)), Identity("r", A, Shard(1, 2))
    records = [
        record(mine, Position("1:1:")),
        record(other_shard, Position("5:5:")),
        record(Identity("r2", A), Position("6:6:")),
        record(Identity("r", B, Shard(0, 3)), Position("7:7:")),  # same name, another outbox
        record(mine, Position("3:3:", "4:4:", 8)),
        (b"unrelated", None),
    ]
    assert latest_position(records, mine) == Position("3:3:", "4:4:", 8)
    assert latest_position(records, Identity("r", B, Shard(0, 3))) == Position("7:7:")
    assert latest_position(records, Identity("r3", A)) is None


@given(
    deltas=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=3),
    order=st.randoms(use_true_random=False),
)
def test_the_last_position_written_is_found_however_partitions_split_it(deltas, cuts, order) -> None:  # type: ignore[no-untyped-def]
    """Partitions added to the positions topic move a relay's key: its records then lie in several
    partitions, each read in order but the partitions one after another, in any order. The position
    found is still the last one written: the furthest by (mark, delta finished, after_id)."""
    relay = Identity("r", A)
    position, written = Position("1:1:", mark=1), []
    for number, delta in enumerate(deltas, start=2):  # each delta's batches, as fetched ids
        target, after = Target(f"{number}:{number}:", number), 0
        for size in delta:
            ids = list(range(after + 1, after + size + 2))  # a full fetch: one row more than the limit
            step = advance(position, target, ids, limit=size)
            position, after = step.position, ids[size - 1]
            written.append(position)
        position = advance(position, target, [after + 1], limit=5).position  # a short fetch finishes it
        written.append(position)
    bounds = sorted({min(c, len(written)) for c in cuts} | {0, len(written)})
    partitions = [written[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    order.shuffle(partitions)
    records = [record(relay, p) for partition in partitions for p in partition]
    assert latest_position(records, relay) == written[-1]


def test_a_position_from_before_marks_never_outranks_one_with_a_mark() -> None:
    """A relay from before marks wrote positions without one; once upgraded, every position it writes
    has one. Read after them from another partition, the old one was taken (and published again)."""
    relay = Identity("r", A)
    legacy, m3, m5 = Position("2:2:"), Position("3:3:", mark=3), Position("5:5:", mark=5)
    for order in ([m3, m5, legacy], [m5, legacy, m3], [legacy, m5, m3]):
        assert latest_position([record(relay, p) for p in order], relay) == m5, order
    old, older = Position("2:2:"), Position("1:1:", "2:2:", 7)
    assert latest_position([record(relay, p) for p in (older, old)], relay) == old  # read order


def test_the_same_name_on_two_outboxes_is_two_relays() -> None:
    """Keys and transactional ids differ by outbox: a relay never fences nor reads another outbox's."""
    a, b = Identity("shared", A), Identity("shared", B)
    assert a.position_key != b.position_key and a.transactional_id != b.transactional_id
    assert latest_position([record(a, Position("9:9:"))], b) is None


def test_a_position_naming_another_outbox_is_refused() -> None:
    mine = Identity("r", A)
    forged = (mine.position_key, Position("9:9:").to_json(Identity("r", B)))
    with pytest.raises(ConfigError) as refused:
        latest_position([forged], mine)
    assert refused.value.code == "RELAY_POSITION_OTHER_OUTBOX"


def test_a_different_shard_count_is_refused() -> None:
    records = [record(Identity("r", A, Shard(0, 3)), Position())]
    with pytest.raises(ConfigError) as refused:
        latest_position(records, Identity("r", A, Shard(0, 2)))
    assert refused.value.code == "RELAY_SHARD_COUNT_CHANGED"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("2/2", "RELAY_SHARD_OUT_OF_RANGE"),
        ("-1/2", "RELAY_SHARD_MALFORMED"),
        ("1", "RELAY_SHARD_MALFORMED"),
        ("a/b", "RELAY_SHARD_MALFORMED"),
        ("0/0", "RELAY_SHARD_OUT_OF_RANGE"),
    ],
)
def test_bad_shards(text: str, code: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Shard.parse(text)
    assert refused.value.code == code
    assert "--shard" in refused.value.message  # names the flag


def test_kafka_settings_from_file_and_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    file = tmp_path / "client.properties"
    file.write_text("# comment\nsecurity.protocol=SASL_SSL\nsasl.password = s3cret\nlinger.ms=1\n")
    settings = kafka_settings(["linger.ms=20", "compression.type=zstd"], file)
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "s3cret",
        "linger.ms": "20",
        "compression.type": "zstd",
    }
    assert "s3cret" not in str(redacted(settings))
    with pytest.raises(ConfigError) as malformed:
        kafka_settings(["linger.ms"], None)
    assert malformed.value.code == "RELAY_KAFKA_SETTING_MALFORMED"


def test_a_java_properties_file_is_read_as_java_reads_it_and_a_bad_line_shows_no_value(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Connect workers' files also separate with ':' or a space; a line that is none of these is
    named by its number and key, never shown: it may hold a password."""
    file = tmp_path / "client.properties"
    file.write_text("sasl.username: relay\nsasl.password s3cret:x=y\nlinger.ms=1\n")
    assert kafka_settings([], file) == {
        "sasl.username": "relay",
        "sasl.password": "s3cret:x=y",
        "linger.ms": "1",
    }
    file.write_text("linger.ms=1\nsasl.password\n")
    with pytest.raises(ConfigError) as malformed:
        kafka_settings([], file)
    assert malformed.value.code == "RELAY_KAFKA_SETTING_MALFORMED"
    assert "line 2" in malformed.value.message and "sasl.password" in malformed.value.message
    with pytest.raises(ConfigError) as flag:
        kafka_settings(["sasl.password:s3cret"], None)
    assert "s3cret" not in flag.value.message, flag.value.message


@pytest.mark.parametrize("key", ["transactional.id", "enable.idempotence"])
def test_guarantee_settings_cannot_be_overridden(key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Publisher("localhost:9092", {key: "x"}, Identity("r", A), "positions")
    assert refused.value.code == "RELAY_KAFKA_SETTING_RESERVED"
    assert key in refused.value.message  # names the setting


def test_backoff_doubles_and_is_capped() -> None:
    assert 0.4 <= backoff(1) <= 0.6
    assert 0.8 <= backoff(2) <= 1.2
    assert 24 <= backoff(30) <= 36
    # --max-retries has no upper limit: after 1,024 failures in a row (9 hours of outage) the
    # doubling overflowed a float and the relay ended with a traceback.
    assert 24 <= backoff(1025) <= 36 and 24 <= backoff(10**9) <= 36


def test_poison_is_the_records_fault_only() -> None:
    assert is_poison(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert not is_poison(KafkaError(KafkaError._TRANSPORT))
    assert not is_poison(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert "max.message.bytes" in explain(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), "t", 5)


NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=40)


@given(NAMES)
def test_every_printable_name_is_one_relay_whatever_its_unicode_form(name: str) -> None:
    """Names that look the same (NFC, NFD) are one relay: one position key, one transactional.id."""
    import unicodedata

    spellings = {unicodedata.normalize(form, name) for form in ("NFC", "NFD")} | {name}
    if any("/" in s or s != s.strip() for s in spellings):
        for spelling in spellings:
            with pytest.raises(ConfigError) as refused:
                relay_name(spelling)
            assert refused.value.code == "RELAY_NAME_INVALID"
        return
    names = {relay_name(spelling) for spelling in spellings}
    assert len(names) == 1, f"{spellings!r} would be {len(names)} relays"
    relay = Identity(names.pop(), A)
    assert latest_position([record(relay, Position("9:9:", mark=1))], relay) == Position("9:9:", mark=1)
    relay.transactional_id.encode()  # a name Kafka can carry


def test_relay_settings_made_in_python_take_the_schema_from_outbox_schema(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """As `outbox relay`, `outbox db upgrade` and PostgresSink do: a relay embedded in Python read the
    outbox of schema public while the tables had been made in OUTBOX_SCHEMA's."""
    monkeypatch.setenv("OUTBOX_SCHEMA", "orders_outbox")
    assert RelaySettings(url=None, bootstrap="b:1", name="r").schema == "orders_outbox"  # type: ignore[arg-type]
    assert RelaySettings(url=None, bootstrap="b:1", name="r", schema="given").schema == "given"  # type: ignore[arg-type]
    monkeypatch.delenv("OUTBOX_SCHEMA")
    assert RelaySettings(url=None, bootstrap="b:1", name="r").schema == "public"  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", " x", "x ", "a/b", "tab\there", "nul\x00", "lone\udc80surrogate"])
def test_unusable_names_are_refused_with_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RelaySettings(url=None, bootstrap="b:1", name=name)  # type: ignore[arg-type]
    assert refused.value.code == "RELAY_NAME_INVALID"
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("brokers", "factor", "in_sync"), [(1, 1, "1"), (2, 2, "1"), (3, 3, "2"), (7, 3, "2")]
)
def test_the_positions_topic_is_replicated_as_the_cluster_allows(
    brokers: int, factor: int, in_sync: str
) -> None:
    assert replication(brokers) == (
        factor,
        {
            "cleanup.policy": "compact",
            "min.insync.replicas": in_sync,
            "segment.bytes": str(16 * 2**20),
            "segment.ms": "3600000",
            "unclean.leader.election.enable": "false",
        },
    )


@given(
    live=st.sets(st.integers(0, 9), min_size=1),
    topics=st.lists(st.lists(st.sets(st.integers(0, 9), min_size=1), max_size=4), max_size=4),
)
def test_the_cluster_counts_its_brokers_that_are_down_too(
    live: set[int], topics: list[list[set[int]]]
) -> None:
    """Kafka lists live brokers only; every broker a partition's replicas name is the cluster's too."""
    metadata = ClusterMetadata()
    metadata.brokers = {b: BrokerMetadata() for b in live}
    for t, partitions in enumerate(topics):
        metadata.topics[f"t{t}"] = TopicMetadata()
        for p, replicas in enumerate(partitions):
            metadata.topics[f"t{t}"].partitions[p] = PartitionMetadata()
            metadata.topics[f"t{t}"].partitions[p].replicas = sorted(replicas)
    assert cluster_size(metadata) == len(live.union(*(r for t in topics for r in t)))


def test_an_under_replicated_or_uncompacted_positions_topic_is_named_with_the_remedy() -> None:
    made = {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
        "segment.bytes": "16777216",
        "segment.ms": "3600000",
    }
    assert problems("p", 3, 3, made) == []
    [few] = problems("p", 1, 3, made)
    assert "1 replica(s) on a cluster of 3" in few and "3 replicas" in few
    # Compacted and deleted too: an idle relay writes no position, and retention deletes its last one.
    for policy in ("delete", "compact,delete"):
        [uncompacted] = problems("p", 3, 3, {**made, "cleanup.policy": policy})
        assert "cleanup.policy=compact" in uncompacted and f"cleanup.policy={policy}" in uncompacted
    # Partitions added: a relay's key moves to another one, and its old position there is read too.
    [spread] = problems("p", 3, 3, made, partitions=4)
    assert "4 partitions" in spread and "one partition" in spread
    # One made before the relay set its segments: Kafka's 1 GiB or 7 days, never compacted while open.
    [open_long] = problems("p", 3, 3, {**made, "segment.bytes": "1073741824", "segment.ms": "604800000"})
    assert "segment.bytes=1073741824 or segment.ms=604800000" in open_long
    assert "segment.bytes=16777216 and segment.ms=3600000" in open_long


def test_a_positions_topic_that_can_lose_an_acknowledged_position_is_named_with_the_remedy() -> None:
    """Each loses the latest positions with a broker (the relay then publishes again what its outbox
    holds): a write one replica took, or an out-of-sync replica made leader."""
    made = replication(3)[1]
    assert problems("p", 3, 3, made) == []
    [one] = problems("p", 3, 3, {**made, "min.insync.replicas": "1"})
    assert "min.insync.replicas=1" in one and "Set min.insync.replicas=2" in one
    assert problems("p", 2, 2, replication(2)[1]) == []  # two replicas: one in sync is all there is
    assert problems("p", 1, 1, replication(1)[1]) == []
    # Two replicas on three brokers: reassigning is the remedy; two in sync would stop at a broker down.
    [short] = problems("p", 2, 3, {**made, "min.insync.replicas": "1"})
    assert "Reassign it to 3 replicas" in short
    [unclean] = problems("p", 3, 3, {**made, "unclean.leader.election.enable": "true"})
    assert "unclean.leader.election.enable=false" in unclean


@given(
    topic=st.text(min_size=1, max_size=40),
    config=st.dictionaries(
        st.sampled_from(["unclean.leader.election.enable", "min.insync.replicas", "cleanup.policy"]),
        st.one_of(st.none(), st.sampled_from(["true", "false", "1", "compact", ""])),
    ),
)
def test_an_events_topic_is_named_exactly_when_an_out_of_sync_leader_can_drop_what_was_published(
    topic: str, config: dict[str, str | None]
) -> None:
    """What Kafka committed and the relay recorded as published is never published again: a topic
    that may elect a replica without it loses it."""
    found = risks(topic, config)
    if config.get("unclean.leader.election.enable") == "true":
        [line] = found
        assert repr(topic) in line and "Set unclean.leader.election.enable=false" in line
    else:
        assert found == []


def test_an_admin_answer_that_does_not_come_in_time_is_a_kafka_timeout_the_relay_retries() -> None:
    """Python's TimeoutError from an admin future ended the relay's process (run() retries Kafka's
    errors only), e.g. DescribeConfigs sent to a broker still starting after an outage."""
    with pytest.raises(KafkaException) as raised:
        answer(Future(), 0.01)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    done: Future[int] = Future()
    done.set_result(7)
    assert answer(done, 0.01) == 7


def test_a_creation_kafka_refuses_is_said_one_it_did_not_answer_is_asked_again() -> None:
    """A timeout or a broker leaving in a rolling restart was RELAY_POSITIONS_TOPIC_NOT_CREATED, a
    ConfigError that ended the relay's process on its first start."""
    for passing in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._DESTROY_BROKER):
        assert not refused(KafkaError(passing)), passing
    for final in (
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_REPLICATION_FACTOR,
    ):
        assert refused(KafkaError(final)), final


def test_a_row_written_by_hand_that_cannot_go_out_as_written_is_named() -> None:
    def row(topic: str = "t", keys: list | None = None, values: list | None = None, id: int = 1) -> Row:
        return Row(id, b"e", topic, None, b"v", keys, values, 0.0)

    assert unpublishable([row()], "positions") is None
    assert unpublishable([row(keys=["h", "h"], values=[b"1", None])], "positions") is None  # repeats, NULLs
    said = {
        "differ in length (1 and 0)": row(keys=["h"]),
        "one-dimensional": row(keys=[["a"]], values=[[b"x"]]),
        "NULL": row(keys=[None], values=[b"x"]),
        "'event_id'": row(keys=["event_id"], values=[b"x"]),
        "no name Kafka takes": row(topic="a b"),
        "positions topic": row(topic="positions"),
    }
    for why, bad in said.items():
        assert why in (unpublishable([bad], "positions") or (0, ""))[1], why
    # The first bad row in the batch, whichever its fault: a topic's is found once, at its first row.
    batch = [row(id=1), row(topic="a b", id=2), row(keys=["h"], id=3), row(topic="a b", id=4)]
    assert unpublishable(batch, "positions") == (2, unpublishable([batch[1]], "positions")[1])  # type: ignore[index]
    assert unpublishable(batch[2:], "positions")[0] == 3  # type: ignore[index]


@pytest.mark.parametrize(
    ("exactly_once", "settings", "window"),
    [
        (True, {}, 60.0),  # the commit asked for 2 x 30 s; the transaction's 60 s
        (True, {"transaction.timeout.ms": "8000"}, 8.0),  # a -X value is text
        (True, {"transaction.timeout.ms": 900_000}, 60.0),  # the commit gives up first
        (True, {"delivery.timeout.ms": "20000"}, 20.0),
        (False, {"message.timeout.ms": "0"}, 30.0),  # 0: records never time out; the flush waits 30 s
        (False, {"message.timeout.ms": 10_000, "transaction.timeout.ms": 1000}, 10.0),
    ],
)
def test_the_window_a_batch_has_is_the_first_limit_it_meets(
    exactly_once: bool, settings: dict[str, object], window: float
) -> None:
    publisher = Publisher("h:1", settings, Identity("r", A), "p", exactly_once=exactly_once, timeout=30)
    assert publisher.window == window


@given(
    limit=st.integers(1, 10_000),
    sent=st.integers(1, 10_000),
    elapsed=st.floats(0, 600),
    window=st.floats(0.001, 600),
)
def test_batches_shrink_after_one_that_ran_out_of_time_and_grow_back_when_fast(
    limit: int, sent: int, elapsed: float, window: float
) -> None:
    """A batch that failed late in its window halves the next ones (never below 1): the same batch
    sent again would fail the same way. A failure early in it (a broker down) changes nothing. A full
    batch that went fast doubles them, up to --batch-size; no batch makes them larger than that."""
    sent = min(sent, limit)
    failed = pace.after_failure(limit, sent, elapsed, window)
    assert 1 <= failed <= limit
    assert (failed < limit) == (elapsed >= window / 2 and limit > 1)
    if failed < limit:
        assert failed == max(1, sent // 2)
    most = limit * 3
    grown = pace.after_success(limit, most, sent, elapsed, window)
    assert limit <= grown <= most
    assert (grown > limit) == (sent == limit and elapsed < window / 4)


def test_the_docs_list_the_acls_the_relay_declares() -> None:
    """docs/relay.md's kafka-acls lines are the grants `outbox.relay.acls` declares, for its example."""
    docs = (REPO / "docs" / "relay.md").read_text()
    lines = {line.strip() for line in docs.splitlines() if line.strip().startswith("kafka-acls ")}
    declared = [*acls.grants("NAME", "outbox-relay-positions"), acls.events_topic("orders.changed")]
    assert {g.command("B", "User:relay") for g in declared} == lines


@pytest.mark.parametrize(
    ("code", "create", "wanted"),
    [
        (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False, acls.transactions("r")),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, False, acls.positions("p")),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, True, acls.creating("p")),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, True, acls.creating("p")),
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, False, None),  # an older broker's IdempotentWrite
        (KafkaError._TIMED_OUT, False, None),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, False, None),
    ],
)
def test_a_refusal_names_the_grant_it_asks_for(code: int, create: bool, wanted: acls.Grant | None) -> None:
    access = acls.Access.of("b:9092", "r", "p", {"sasl.username": "svc relay"})
    assert access.grant(KafkaError(code), create=create) == wanted
    said = access.refused(KafkaError(code), create=create)
    assert (said is None) == (wanted is None)
    if wanted is not None and said is not None:
        assert said.code == "RELAY_KAFKA_NOT_AUTHORIZED"
        assert wanted.command("b:9092", "User:svc relay") in said.message
        assert "--allow-principal 'User:svc relay'" in said.message  # quoted for a shell


@given(st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_a_loop_is_alive_until_it_is_later_than_its_bound_past_its_wait(late: float, bound: float) -> None:
    from outbox.relay.metrics import liveness

    ok, said = liveness(late, bound, "retrying: Kafka")
    assert ok == (late <= bound)
    assert said == "alive" if ok else said.startswith("wedged: ") and said.endswith("last: retrying: Kafka")


def test_the_probes_answer_a_relay_that_starts_halts_and_turns_its_loop() -> None:
    """A relay starting is not ready and alive; halted, alive and not ready while its wait lasts;
    past the wait and the bound, wedged."""
    import urllib.error
    import urllib.request

    from outbox.relay.metrics import RelayMetrics, serve

    metrics = RelayMetrics("r", "0/1")
    server = serve(metrics, "127.0.0.1:0", wedged_after=3600)
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as answer:
                return answer.status, answer.read().decode().strip()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode().strip()

    try:
        assert get("/readyz") == (503, "starting") and get("/livez") == (200, "alive")
        metrics.health(True, "active")
        assert get("/readyz") == get("/healthz") == (200, "active")
        metrics.health(False, "halted: row 7", waits=30)
        assert get("/readyz") == (503, "halted: row 7") and get("/livez") == (200, "alive")
        assert get("/nothing")[0] == 404
    finally:
        server.shutdown()
        server.server_close()
    wedged = RelayMetrics("r", "0/1")
    wedged.health(True, "active", waits=-10)  # its wait ended 10 s ago
    ok, said = wedged.read_liveness(5)
    assert not ok and said.startswith("wedged: the loop has not turned for 10s"), said
