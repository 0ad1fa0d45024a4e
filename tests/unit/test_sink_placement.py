"""Where the sink applies a batch: proven from the frame's plan, on trees and on real Spark frames."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.errors import ConfigError
from sinks.postgres.placement import NARROW, Node, choose, route

KAFKA_RC = Node("StreamingRelationV2", source="kafka_rc", options={"subscribe": "t"})
POSITION = frozenset({3, 4})


def over(node: Node, *names: str) -> Node:
    for name in reversed(names):
        node = Node(name, (node,))
    return node


def test_a_kafka_source_under_narrow_steps_applies_in_tasks() -> None:
    assert route(over(KAFKA_RC, "Project", "Filter", "MapInArrow"), POSITION).tasks
    spark_kafka = Node("StreamingRelationV2", source="kafka", options={})
    assert route(over(spark_kafka, "Project"), POSITION).tasks
    coalesced = Node("Repartition", (KAFKA_RC,), partitions=3, shuffle=False)
    assert route(coalesced, POSITION).tasks  # merging whole partitions keeps each whole


@pytest.mark.parametrize(
    ("tree", "why"),
    [
        (Node("StreamingRelationV2", source="kafka_rc", options={"minpartitions": "8"}), "minpartitions"),
        (Node("StreamingRelationV2", source="kafka", options={"maxrecordsperpartition": "9"}), "maxrecords"),
        (Node("Repartition", (KAFKA_RC,), partitions=4), "Repartition"),
        (Node("RepartitionByExpression", (KAFKA_RC,), partitions=4, by=(3, 99)), "RepartitionByExpression"),
        (Node("RepartitionByExpression", (KAFKA_RC,), partitions=4, by=None), "RepartitionByExpression"),
        (Node("Union", (KAFKA_RC, KAFKA_RC)), "Union"),
        (Node("Join", (KAFKA_RC, Node("LocalRelation"))), "Join"),
        (Node("Aggregate", (KAFKA_RC,)), "Aggregate"),
        (Node("StreamingRelationV2", source="rate"), "reads rate"),
        (Node("LogicalRDD"), "reads LogicalRDD"),
    ],
)
def test_what_may_split_a_topic_partition_goes_to_the_driver(tree: Node, why: str) -> None:
    found = route(over(tree, "Project"), POSITION)
    assert not found.tasks and why in found.why


def test_one_partition_or_partitioning_by_position_applies_in_tasks_whatever_is_below() -> None:
    below = Node("Union", (Node("LogicalRDD"), Node("LogicalRDD")))
    assert route(Node("Repartition", (below,), partitions=1), POSITION).tasks
    assert route(Node("RepartitionByExpression", (below,), partitions=6, by=(4,)), POSITION).tasks
    assert route(Node("RepartitionByExpression", (below,), partitions=6, by=(3, 4)), POSITION).tasks


# Any stack of operators over a Kafka source: tasks only if every one of them is narrow.
@given(st.lists(st.sampled_from(sorted(NARROW | {"Repartition", "Union", "Join", "Aggregate", "Sort"}))))
def test_a_stack_applies_in_tasks_exactly_when_every_step_is_narrow(names: list[str]) -> None:
    tree = over(KAFKA_RC, *names)
    assert route(tree, POSITION).tasks == all(n in NARROW for n in names)


def test_apply_in_tasks_refuses_what_it_cannot_prove_and_driver_is_always_honoured() -> None:
    split = over(Node("Repartition", (KAFKA_RC,), partitions=4), "Project")
    with pytest.raises(
        ConfigError, match=r"apply_in='tasks' needs .* but Repartition in the frame's plan"
    ) as caught:
        choose(split, POSITION, "tasks")
    assert caught.value.code == "SINK_TASKS_UNPROVEN"
    assert not choose(split, POSITION, "auto").tasks
    assert not choose(KAFKA_RC, POSITION, "driver").tasks
    assert choose(KAFKA_RC, POSITION, "tasks").tasks
    assert not choose(None, POSITION, "auto").tasks
