import itertools

import hypothesis.strategies as st
import pytest
from hypothesis import given

from outbox.core.errors import ConfigError
from sinks.errors import KAFKA_RC_LOSS_ADVICE
from sinks.kafka_source import ranges
from sinks.kafka_source.options import parse

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_offsets_round_trip_in_sparks_json_shape() -> None:
    positions = {A0: 5, A1: 7, B0: 0}
    encoded = ranges.to_offsets(positions)
    assert encoded == {"a": {"0": 5, "1": 7}, "b": {"0": 0}}
    assert ranges.from_offsets(encoded) == positions


def test_resolve_earliest_latest_and_json() -> None:
    earliest, latest = {A0: 2, A1: 0}, {A0: 10, A1: 4}
    assert ranges.resolve("earliest", [A0, A1], earliest, latest, option="x") == earliest
    assert ranges.resolve("latest", [A0, A1], earliest, latest, option="x") == latest
    spec = {"a": {"0": -2, "1": 3}}
    assert ranges.resolve(spec, [A0, A1], earliest, latest, option="x") == {A0: 2, A1: 3}
    with pytest.raises(ConfigError, match="gives no offset for a-1") as caught:
        ranges.resolve({"a": {"0": 1}}, [A0, A1], earliest, latest, option="x")
    assert caught.value.code == "KAFKA_RC_OFFSETS_INCOMPLETE"


def test_cap_shares_the_limit_by_backlog_and_never_exceeds_latest() -> None:
    start = {A0: 0, A1: 100, B0: 0}
    latest = {A0: 300, A1: 200, B0: 0}
    end = ranges.cap(start, latest, 100)
    assert sum(end[tp] - start[tp] for tp in start) == 100
    assert end[A0] - start[A0] == 75 and end[A1] - start[A1] == 25 and end[B0] == 0
    assert ranges.cap(start, latest, None) == latest
    assert ranges.cap(start, latest, 10_000) == latest


@given(
    st.dictionaries(st.integers(0, 20), st.integers(0, 1000)),
    st.dictionaries(st.integers(0, 20), st.integers(0, 1000)),
)
def test_hold_keeps_every_partition_a_batch_does_not_move_where_it_is(
    begin: dict[int, int], end: dict[int, int]
) -> None:
    """A partition left out of a batch's end (no leader to ask) would start again at its earliest
    offset: every partition of the start is in the end, where the batch moved it or where it was."""
    start, stop = {("t", p): o for p, o in begin.items()}, {("t", p): o for p, o in end.items()}
    held = ranges.hold(start, stop)
    assert set(held) == set(start) | set(stop)
    assert all(held[tp] == (stop[tp] if tp in stop else start[tp]) for tp in held)


def test_cap_with_rounding_still_hands_out_the_whole_limit() -> None:
    start = {A0: 0, A1: 0, B0: 0}
    latest = {A0: 10, A1: 10, B0: 10}
    end = ranges.cap(start, latest, 10)
    assert sum(end.values()) == 10 and all(3 <= v <= 4 for v in end.values())


def test_ranges_skip_empty_and_start_new_partitions_at_their_end() -> None:
    assert ranges.ranges({A0: 5, A1: 3}, {A0: 9, A1: 3, B0: 4}) == [ranges.Range("a", 0, 5, 9)]


def test_options_mirror_sparks_kafka_source() -> None:
    opts = parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "a, b",
            "startingOffsets": '{"a":{"0":-2}}',
            "maxOffsetsPerTrigger": "50",
            "kafka.security.protocol": "SSL",
        }
    )
    assert opts.topics == ("a", "b") and opts.max_offsets_per_trigger == 50
    assert opts.consumer_config()["isolation.level"] == "read_committed"
    assert opts.consumer_config()["security.protocol"] == "SSL"


@pytest.mark.parametrize(
    ("options", "code", "named"),
    [
        ({"subscribe": "a"}, "KAFKA_RC_BOOTSTRAP_MISSING", ""),
        ({"kafka.bootstrap.servers": "h:1"}, "KAFKA_RC_SUBSCRIPTION_NOT_ONE", ""),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "kafka.isolation.level": "read_uncommitted"},
            "KAFKA_RC_ISOLATION_LEVEL_SET",
            "unsafe.readUncommitted",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "startingOffsets": "first"},
            "KAFKA_RC_OFFSETS_INVALID",
            "startingOffsets",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "maxOffsetsPerTrigger": "0"},
            "SETTING_NOT_POSITIVE",
            "option maxOffsetsPerTrigger",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "minPartitions": "2.5"},
            "SETTING_MALFORMED",
            "option minPartitions must be an integer, got '2.5'",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "failOnDataLoss": "yes"},
            "SETTING_MALFORMED",
            "option failOnDataLoss must be true or false, got 'yes'",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "kafka.group.id": "g"},
            "KAFKA_RC_OPTION_UNSUPPORTED",
            "",
        ),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "subscrbe": "b"},
            "KAFKA_RC_OPTION_UNKNOWN",
            "",
        ),
        # Read silently otherwise: a float or a bool taken for an offset, a partition given twice
        # (the last won), an offset no position means, a topic the query does not read, an empty
        # pattern beside subscribe (it won, and every topic was "missing"), settings the source
        # sets itself; or a traceback.
        *(
            ({"kafka.bootstrap.servers": "h:1", "subscribe": "a", option: value}, code, named)
            for option, value, code, named in [
                ("startingOffsets", '{"a":{"0":1.9}}', "KAFKA_RC_OFFSETS_INVALID", "1.9"),
                ("startingOffsets", '{"a":{"0":true}}', "KAFKA_RC_OFFSETS_INVALID", "true"),
                ("startingOffsets", '{"a":{"0":5,"00":7}}', "KAFKA_RC_OFFSETS_INVALID", "twice"),
                ("startingOffsets", '{"a":{"0":5,"0":7}}', "KAFKA_RC_OFFSETS_INVALID", "twice"),
                ("startingOffsets", '{"a":{"0":-3}}', "KAFKA_RC_OFFSETS_INVALID", "-3"),
                ("startingOffsets", '{"a":{"-1":0}}', "KAFKA_RC_OFFSETS_INVALID", "-1"),
                ("startingOffsets", '{"a":{"0":Infinity}}', "KAFKA_RC_OFFSETS_INVALID", "Infinity"),
                ("startingOffsets", '{"a":{"0":1e400}}', "KAFKA_RC_OFFSETS_INVALID", "1e400"),
                ("startingOffsets", "[" * 100000, "KAFKA_RC_OFFSETS_INVALID", "startingOffsets"),
                ("startingOffsets", '{"b":{"0":0}}', "KAFKA_RC_OFFSETS_TOPIC_NOT_READ", "'b'"),
                ("endingOffsets", "earliest", "KAFKA_RC_OFFSETS_INVALID", "endingOffsets"),
                ("endingOffsets", '{"a":{"0":-2}}', "KAFKA_RC_OFFSETS_INVALID", "-2"),
                ("subscribePattern", "", "KAFKA_RC_SUBSCRIPTION_NOT_ONE", ""),
                ("kafka.auto.offset.reset", "latest", "KAFKA_RC_OPTION_UNSUPPORTED", "auto.offset.reset"),
                ("kafka.enable.partition.eof", "true", "KAFKA_RC_OPTION_UNSUPPORTED", "partition.eof"),
            ]
        ),
    ],
)
def test_bad_options_fail_before_anything_runs(options: dict[str, str], code: str, named: str) -> None:
    """named: what the message must name, beside its code."""
    with pytest.raises(ConfigError) as caught:
        parse(options)
    assert caught.value.code == code and named in caught.value.message


def test_the_wait_for_kafka_is_unbounded_in_a_stream_unless_an_option_bounds_it() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "a"}
    assert parse(base).unavailable_timeout_s is None
    assert parse({**base, "unavailableTimeoutMs": "90000"}).unavailable_timeout_s == 90.0
    with pytest.raises(ConfigError, match="unavailableTimeoutMs") as caught:
        parse({**base, "unavailableTimeoutMs": "-1"})
    assert caught.value.code == "SETTING_NOT_POSITIVE"


def test_read_uncommitted_needs_the_loud_opt_in() -> None:
    opts = parse({"kafka.bootstrap.servers": "h:1", "subscribe": "a", "unsafe.readUncommitted": "true"})
    assert opts.consumer_config()["isolation.level"] == "read_uncommitted"


def test_overlay_starts_where_the_ledger_says() -> None:
    assert ranges.overlay({A0: 0, A1: 0}, {A0: 20, ("gone", 0): 5}) == {A0: 20, A1: 0}


def test_offsets_carry_topic_ids_and_old_checkpoints_have_none() -> None:
    encoded = ranges.to_offsets({A0: 5, B0: 1}, {"a": "id-a", "b": "id-b", "c": "id-c"})
    assert encoded[ranges.IDS] == {"a": "id-a", "b": "id-b"}
    assert ranges.from_offsets(encoded) == {A0: 5, B0: 1}
    assert ranges.topic_ids(encoded) == {"a": "id-a", "b": "id-b"}
    assert ranges.topic_ids({"a": {"0": 5}}) == {}


def test_reconcile_keeps_what_is_there() -> None:
    begin = {A0: 5, A1: 7}
    assert ranges.reconcile(begin, {"a": "x"}, {"a": "x"}, {A0: 0, A1: 0}, {A0: 9, A1: 7}) == (begin, [])
    assert ranges.reconcile(begin, {}, {"a": "x"}, {A0: 0, A1: 0}, {A0: 9, A1: 7}) == (begin, [])


def test_reconcile_reads_a_recreated_topic_from_its_start_all_its_partitions() -> None:
    begin, losses = ranges.reconcile(
        {A0: 1000, B0: 3},
        {"a": "old", "b": "b"},
        {"a": "new", "b": "b"},
        {A0: 0, A1: 0, B0: 0},
        {A0: 1200, A1: 4, B0: 3},
    )
    assert begin == {A0: 0, A1: 0, B0: 3}
    assert [(loss.code, loss.message) for loss in losses] == [
        (
            "KAFKA_RC_TOPIC_RECREATED",
            "topic a was deleted and created again (topic id old, now new):"
            " the offsets read so far are of the old topic" + KAFKA_RC_LOSS_ADVICE,
        )
    ]


def test_reconcile_names_a_truncated_log_and_records_retention_deleted_unread() -> None:
    begin, losses = ranges.reconcile({A0: 60, A1: 2}, {}, {}, {A0: 0, A1: 10}, {A0: 50, A1: 20})
    assert begin == {A0: 0, A1: 10}
    assert [(loss.code, loss.message) for loss in losses] == [
        (
            "KAFKA_RC_LOG_TRUNCATED",
            "a-0 now ends at offset 50, before offset 60 already read: its log was truncated, or the topic"
            " created again" + KAFKA_RC_LOSS_ADVICE,
        ),
        (
            "KAFKA_RC_OFFSETS_DELETED",
            "offsets 2-9 of a-1 were deleted before they were read (retention?)" + KAFKA_RC_LOSS_ADVICE,
        ),
    ]


def test_reconcile_goes_on_from_a_truncated_logs_end_when_the_topic_is_the_one_read() -> None:
    """Offsets below the new end were read already (Kafka keeps a truncated log's prefix); taken
    again from earliest, they were read twice with failOnDataLoss=false. Spark's own source goes
    on from the end too. Without the topic's id to tell a truncation from a topic created again
    under its name, the earliest offset still: reading again is better than a loss."""
    ids = {"a": "x", "b": "y"}
    begin, losses = ranges.reconcile({A0: 60, B0: 9}, ids, ids, {A0: 5, B0: 0}, {A0: 50, B0: 7})
    assert begin == {A0: 50, B0: 7}
    assert [loss.code for loss in losses] == ["KAFKA_RC_LOG_TRUNCATED"] * 2
    begin, _ = ranges.reconcile({A0: 60, B0: 9}, {"b": "y"}, ids, {A0: 5, B0: 0}, {A0: 50, B0: 7})
    assert begin == {A0: 5, B0: 7}


def test_split_reaches_min_partitions_sized_by_backlog() -> None:
    rngs = [ranges.Range("a", 0, 0, 90), ranges.Range("a", 1, 0, 10)]
    pieces = ranges.split(rngs, 10)
    assert len(pieces) >= 10
    for p in (0, 1):  # the pieces of each partition tile its range exactly, in order
        mine = [r for r in pieces if r.partition == p]
        assert mine[0].start == 0 and mine[-1].end == rngs[p].end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
    assert ranges.split(rngs, None) == rngs and ranges.split(rngs, 2) == rngs
    assert ranges.split([ranges.Range("a", 0, 0, 3)], 10) == [
        ranges.Range("a", 0, i, i + 1) for i in range(3)
    ]


def test_what_passes_by_itself_is_asked_again_other_errors_are_not() -> None:
    """A leader just moved or not caught up, a broker down, a cluster below quorum: asked again.
    So is a request failed because its broker left the cluster's metadata (_DESTROY_BROKER, in a
    rolling restart): that ended a stream in test_cluster_loop. Authorisation and bad requests: said
    at once."""
    from confluent_kafka import KafkaError

    from sinks.kafka_source.cluster import transient

    passing = (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._DESTROY_BROKER,
    )
    for code in passing:
        assert transient(KafkaError(code)), code
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.INVALID_REQUEST, KafkaError._SSL):
        assert not transient(KafkaError(code)), code


def test_a_partition_without_a_leader_is_waited_for_a_gone_one_is_not() -> None:
    """librdkafka fails a whole offsets request when one partition has no leader ('No leaders
    found', _NOENT): the metadata tells such a partition (wait for its broker) from a deleted topic
    or a partition a topic made again no longer has (say so now). Every one led again by the time
    the metadata answers: the leader came back meanwhile, so ask again (session 22's CI met it)."""
    from confluent_kafka import KafkaError, TopicPartition
    from confluent_kafka.admin import PartitionMetadata, TopicMetadata

    from sinks.kafka_source.cluster import leader_wait

    def topic(name: str, leaders: list[int]) -> TopicMetadata:
        metadata = TopicMetadata()
        metadata.topic = name
        for pid, leader in enumerate(leaders):
            partition = PartitionMetadata()
            partition.id, partition.leader = pid, leader
            metadata.partitions[pid] = partition
        return metadata

    no_leaders, refused = KafkaError(KafkaError._NOENT), KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    topics = {"a": topic("a", [1, -1]), "b": topic("b", [-1])}
    wanted = [TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)]
    for failed in (no_leaders, refused):
        assert leader_wait(failed, topics, wanted) == [("a", 1), ("b", 0)]
        assert leader_wait(failed, topics, [*wanted, TopicPartition("gone", 0)]) == []  # deleted
        assert leader_wait(failed, topics, [*wanted, TopicPartition("b", 3)]) == []  # made again, smaller
    assert leader_wait(no_leaders, topics, wanted[:1]) == [("a", 0)]  # led again since: ask again
    assert leader_wait(refused, topics, wanted[:1]) == []  # every one led: not a leader's absence


@given(
    st.lists(st.integers(1, 50), max_size=30),
    st.integers(1, 120),
)
def test_packing_keeps_each_range_whole_and_once_in_tasks_of_about_the_size(
    sizes: list[int], records: int
) -> None:
    rngs = [ranges.Range("t", p, 100, 100 + size) for p, size in enumerate(sizes)]
    tasks = ranges.pack(rngs, records)
    assert sorted((r for task in tasks for r in task), key=lambda r: r.partition) == rngs  # each once, whole
    for i, task in enumerate(tasks):
        held = sum(r.end - r.start for r in task)
        if len(task) > 1:  # packed: no more than it takes to reach the size
            assert held - (task[-1].end - task[-1].start) < records
        if i < len(tasks) - 1 and len(task) > 1:
            assert held >= records


def test_offsets_as_spark_takes_them() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "a"}
    assert parse({**base, "startingOffsets": "Earliest"}).starting == "earliest"  # Spark lowercases it
    assert parse({**base, "startingOffsets": '{"a":{"0":-2,"1":7}}'}).starting == {"a": {"0": -2, "1": 7}}
    assert parse({**base, "endingOffsets": '{"a":{"0":-1}}'}).ending == {"a": {"0": -1}}


def test_a_pattern_reads_no_internal_topic() -> None:
    """Kafka's own consumers leave them out of a pattern (exclude.internal.topics): `.*` read the
    offsets and transaction logs, and every record of theirs became a dead letter."""
    opts = parse({"kafka.bootstrap.servers": "h:1", "subscribePattern": ".*"})
    assert opts.matches("orders") and not opts.matches("__consumer_offsets")
    assert not opts.matches("__transaction_state")
    assert parse({"kafka.bootstrap.servers": "h:1", "subscribe": "__consumer_offsets"}).matches(
        "__consumer_offsets"
    )  # named, it is read


def test_a_batch_query_that_ends_before_it_starts_is_refused_not_empty() -> None:
    """Spark's batch refuses it; the ranges were dropped as empty, and the query read nothing."""
    start = {("a", 0): 5, ("a", 1): 0}
    ranges.check_ends(start, {"a": {"0": 5, "1": 3}})  # equal: nothing to read
    ranges.check_ends(start, {"a": {"0": -1, "1": 3}})  # latest: decided by Kafka, maybe before
    ranges.check_ends(start, "latest")
    with pytest.raises(ConfigError) as caught:
        ranges.check_ends(start, {"a": {"0": 4, "1": 3}})
    assert caught.value.code == "KAFKA_RC_OFFSETS_END_BEFORE_START" and "a-0" in caught.value.message


def test_a_stream_refuses_ending_offsets_as_sparks_does() -> None:
    from sinks.kafka_source.source import KafkaSource

    given = {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "endingOffsets": "latest"}
    with pytest.raises(ConfigError) as caught:
        KafkaSource(given).streamReader(None)
    assert caught.value.code == "KAFKA_RC_OPTION_UNSUPPORTED" and "endingOffsets" in caught.value.message


def test_partitions_added_start_at_their_earliest_and_a_start_past_0_is_a_loss() -> None:
    new, losses = ranges.added({A0: 7}, {A0: 0, A1: 0, B0: 12}, {A0: 9, A1: 3, B0: 20})
    assert new == {A1: 0, B0: 12}
    assert [(loss.code, loss.message) for loss in losses] == [
        (
            "KAFKA_RC_OFFSETS_DELETED",
            "offsets 0-11 of b-0 were deleted before they were read (retention?)" + KAFKA_RC_LOSS_ADVICE,
        )
    ]
