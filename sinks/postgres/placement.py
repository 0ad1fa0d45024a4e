"""Where a batch is applied: in the Spark tasks, or staged and applied on the driver.

A task that applies its rows also moves the ledger of the topic-partitions it
holds past them. That is right only if every topic-partition's rows of a batch
reach one task: a second task holding more of the same partition would find
the ledger already past its rows and skip them. `route` proves this from the
frame's logical plan when the query starts (a plain function of a plain tree,
`Node`); what it cannot prove takes the driver path, which is right for any
frame. `spark_plan.read_plan` is the glue that turns Spark's plan into that tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sinks.errors import error

ApplyIn = Literal["auto", "tasks", "driver"]

# Logical operators that keep every row in the task that read it.
NARROW = frozenset(
    {
        "Project",
        "Filter",
        "SubqueryAlias",
        "View",
        "Generate",
        "EventTimeWatermark",
        "ResolvedHint",
        "MapInArrow",
        "MapInPandas",
        "MapPartitions",
        "MapElements",
        "TypedFilter",
        "DeserializeToObject",
        "SerializeFromObject",
    }
)
# Kafka sources that read one topic-partition per task unless these options ask otherwise.
SPLITTING_OPTIONS = {"kafka_rc": ("minpartitions",), "kafka": ("minpartitions", "maxrecordsperpartition")}


@dataclass(frozen=True)
class Node:
    """One logical operator, with what `route` needs to know of it."""

    name: str
    children: tuple[Node, ...] = ()
    source: str | None = None  # a streaming source's short name
    options: Mapping[str, str] = field(default_factory=dict)  # the source's options, lower-cased
    partitions: int | None = None  # Repartition, RepartitionByExpression
    shuffle: bool = True  # Repartition: False for coalesce
    by: tuple[int, ...] | None = None  # RepartitionByExpression: ids of plain columns, else None


@dataclass(frozen=True)
class Route:
    tasks: bool
    why: str

    def __str__(self) -> str:
        where = "in the Spark tasks, in parallel" if self.tasks else "staged, then on the driver"
        return f"applies each batch {where}: {self.why}"


def route(root: Node, position: frozenset[int]) -> Route:
    """Tasks if each topic-partition's rows provably reach one task, else the driver.

    position: ids of the topic and partition columns the sink reads, so that a
    hash partitioning by them counts only if it is by those very columns.
    """
    node = root
    while True:
        if node.name in ("Repartition", "RepartitionByExpression") and node.partitions == 1:
            return Route(True, "the frame is in one partition")
        if node.name == "RepartitionByExpression" and node.by and set(node.by) <= position:
            return Route(True, "the frame is partitioned by its Kafka topic and partition")
        if node.source in SPLITTING_OPTIONS:
            split = [o for o in SPLITTING_OPTIONS[node.source] if o in node.options]
            if split:
                return Route(False, f"the source's {split[0]} option may split a topic-partition over tasks")
            return Route(True, f"each task reads whole topic-partitions from {node.source}")
        if not node.children:
            return Route(
                False,
                f"the frame reads {node.source or node.name}, not a Kafka source known to keep"
                " a topic-partition in one task",
            )
        narrow = node.name in NARROW or (node.name == "Repartition" and not node.shuffle)
        if not narrow or len(node.children) != 1:
            return Route(
                False, f"{node.name} in the frame's plan may spread a topic-partition over several tasks"
            )
        node = node.children[0]


def choose(root: Node | None, position: frozenset[int], apply_in: ApplyIn) -> Route:
    """The route a query takes, from the user's `apply_in`; 'tasks' is refused when it cannot be proven."""
    if apply_in == "driver":
        return Route(False, "apply_in='driver'")
    found = route(root, position) if root else Route(False, "the frame's plan cannot be read here")
    if apply_in == "tasks" and not found.tasks:
        raise error("SINK_TASKS_UNPROVEN", why=found.why)
    return found
