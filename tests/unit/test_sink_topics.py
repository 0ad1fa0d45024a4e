"""The sink's comparison of its ledger with Kafka: topics created again, logs truncated, ids recorded."""

from __future__ import annotations

from sinks.postgres.placement import Node
from sinks.postgres.topics import judge, sources


def test_the_same_topics_need_nothing_and_new_ones_are_recorded() -> None:
    verdict = judge("s", {"a": "1"}, {"a": "1", "b": "2"}, {("a", 0): 10}, {("a", 0): 12})
    assert verdict.losses == () and verdict.topics == () and verdict.partitions == ()
    assert verdict.record == {"b": "2"}


def test_a_topic_created_again_is_forgotten_and_recorded_under_its_new_id() -> None:
    verdict = judge("s", {"a": "1"}, {"a": "9"}, {("a", 0): 1000, ("a", 1): 5}, {})
    assert verdict.topics == ("a",) and verdict.record == {"a": "9"}
    (loss,) = verdict.losses
    assert loss.code == "SINK_TOPIC_RECREATED"
    assert loss.message.startswith(
        "topic a was deleted and created again since sink s applied it (topic id 1, now 9)"
    )
    assert "failOnDataLoss=false" in loss.message


def test_a_log_that_ends_before_the_ledger_was_truncated() -> None:
    verdict = judge("s", {"a": "1"}, {"a": "1"}, {("a", 0): 50, ("a", 1): 5}, {("a", 0): 40, ("a", 1): 5})
    assert verdict.partitions == (("a", 0, 40),) and verdict.topics == ()  # back to the log's end
    assert verdict.losses[0].code == "SINK_LOG_TRUNCATED"
    assert "a-0 now ends at offset 40, but sink s has applied it up to offset 50" in verdict.losses[0].message


def test_a_deleted_topic_not_created_again_is_left_alone() -> None:
    verdict = judge("s", {"a": "1"}, {}, {("a", 0): 50}, {})
    assert verdict == judge("s", {}, {}, {}, {})


def test_the_source_is_found_under_the_frames_steps_with_its_settings() -> None:
    rc = Node(
        "StreamingRelationV2",
        source="kafka_rc",
        options={"kafka.bootstrap.servers": "h:1", "subscribe": "a,b"},
    )
    [found] = sources(Node("Project", (Node("Filter", (rc,)),)), {"sasl.password": "x"})
    assert found.topics == ("a", "b") and found.kafka == {"sasl.password": "x"}
    spark = Node(
        "StreamingRelationV2",
        source="kafka",
        options={
            "kafka.bootstrap.servers": "h:1",
            "assign": '{"t": [0, 1]}',
            "failondataloss": "false",
            "kafka.sasl.jaas.config": "java only",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.isolation.level": "read_uncommitted",  # the user's choice: taken
        },
    )
    [found] = sources(spark, {})
    assert found.topics == ("t",) and not found.fail_on_data_loss
    assert found.read_uncommitted  # log ends are then high watermarks
    assert found.kafka == {"security.protocol": "SASL_SSL"}
    assert sources(Node("LocalRelation"), {}) == []
    # A union: every source, the second too (its topics were not checked before they were applied).
    union = sources(Node("Union", (rc, Node("Project", (spark,)))), {})
    assert [s.topics for s in union] == [("a", "b"), ("t",)]
