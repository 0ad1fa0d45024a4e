"""The glue from a frame's plan to the `Node` tree that `placement.route` judges.

Classic PySpark reaches the analyzed plan over py4j, with each column's
expression id. A Spark Connect client holds no JVM plan, only the unresolved
plan it sends the server (a `proto.Relation`). That is enough: the sink's
question is whether anything between the Kafka source and the frame may move a
row to another task. Without expression ids, the topic and partition columns
are followed by name from the frame down to the source; a step that may have
changed what a name means (a computed column, a positional rename, a function
over partitions) loses it, so a repartition below it proves nothing.
"""

from __future__ import annotations

import re
from typing import Any

from sinks.postgres.placement import Node

# The ids `route` gets for the frame's own topic and partition columns.
POSITION = {"topic": 1, "partition": 2}

# Relations that keep each row in its task, by the name `route` knows them by.
_NARROW = {
    "filter": "Filter",
    "subquery_alias": "SubqueryAlias",
    "with_watermark": "EventTimeWatermark",
    "hint": "ResolvedHint",
    "project": "Project",
    "with_columns": "Project",
    "with_columns_renamed": "Project",
    "drop": "Project",
    "to_df": "Project",
    "map_partitions": "MapInArrow",
}
# Hints the analyzer turns into a shuffle (or a coalesce, which can merge partitions).
_SHUFFLING_HINTS = frozenset({"repartition", "repartition_by_range", "rebalance", "coalesce"})
# A window function in SQL text: a column or literal called "over" is a false alarm, which sends
# the batches to the driver (or refuses the frame, with apply_in='tasks').
_OVER = re.compile(r"\bover\b", re.IGNORECASE)


def is_connect(frame: Any) -> bool:
    """A Spark Connect DataFrame, told without importing pyspark.sql.connect (which needs grpc)."""
    return type(frame).__module__.startswith("pyspark.sql.connect")


def read_plan(frame: Any) -> tuple[Node | None, frozenset[int]]:
    """The frame's plan as a `Node` tree, and the ids of its topic and partition columns there;
    (None, ...) where the plan cannot be read."""
    if is_connect(frame):
        return node(frame._plan.plan(frame.sparkSession.client), dict(POSITION)), frozenset(POSITION.values())
    try:
        plan = frame._jdf.queryExecution().analyzed()
    except AttributeError:
        return None, frozenset()
    position = frozenset(a.exprId().id() for a in _seq(plan.output()) if a.name() in ("topic", "partition"))
    return _classic(plan), position


# Spark's Kafka source by its provider's class name, which Spark takes as a format too.
_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.kafkasourceprovider"


def source_name(written: str) -> str:
    """A source's format as the checks know it: the plan keeps it as the user wrote it, and Spark
    takes it in any case ("Kafka") and Kafka's by its provider's class name."""
    name = written.lower()
    return "kafka" if name == _KAFKA_PROVIDER else name


# -- Spark Connect: the client's proto plan ---------------------------------------------------------------


def node(relation: Any, names: dict[str, int]) -> Node:
    """`relation` as a Node; `names`: the columns of its output still known to be the frame's
    topic or partition, by name, with their ids."""
    kind = relation.WhichOneof("rel_type")
    message: Any = getattr(relation, kind) if kind else None
    if kind == "read":
        if message.WhichOneof("read_type") == "data_source" and message.is_streaming:
            source = message.data_source
            options = {k.lower(): v for k, v in source.options.items()}
            return Node("StreamingRelationV2", source=source_name(source.format), options=options)
        return Node("Read")
    if kind == "repartition":
        child = node(message.input, names)
        return Node("Repartition", (child,), partitions=message.num_partitions, shuffle=message.shuffle)
    if kind == "repartition_by_expression":
        # By hash (columns) or by range (columns' sort orders): equal values land in one partition.
        # Only by columns all followed to the frame's topic and partition: (topic, x) splits a topic.
        ids = [names.get(c) if c else None for c in map(_column, message.partition_exprs)]
        by = tuple(i for i in ids if i is not None) if ids and None not in ids else None
        partitions = message.num_partitions if message.HasField("num_partitions") else None
        child = node(message.input, names)
        return Node("RepartitionByExpression", (child,), partitions=partitions, by=by)
    if kind == "hint" and message.name.lower() in _SHUFFLING_HINTS:
        return Node(f"Hint({message.name})", (node(message.input, {}),))
    if kind in ("project", "with_columns") and _windowed(message):
        return Node("Window", (node(message.input, {}),))
    if kind in _NARROW:
        return Node(_NARROW[kind], (node(message.input, _below(kind, message, names)),))
    return Node(_title(kind), tuple(node(i, {}) for i in _inputs(message, relation)))


def _windowed(message: Any) -> bool:
    """Whether a relation's expressions hold a window function: Spark computes it after a shuffle
    by the window's PARTITION BY, which moves rows to other tasks."""
    for field, value in message.ListFields():
        if field.message_type is None or field.message_type.name == "Relation":
            continue
        for item in value if field.is_repeated else [value]:
            if item.DESCRIPTOR.name == "Expression":
                kind = item.WhichOneof("expr_type")
                if kind == "window":
                    return True
                if kind == "expression_string" and _OVER.search(item.expression_string.expression):
                    return True
            if _windowed(item):
                return True
    return False


def _below(kind: str, message: Any, names: dict[str, int]) -> dict[str, int]:
    """The tracked names as the relation's input calls them."""
    if kind == "project":
        below = {}
        for name, id_ in names.items():
            source = _projected(message.expressions, name)
            if source is not None:
                below[source] = id_
        return below
    if kind == "with_columns":
        assigned = {a.name[-1] for a in message.aliases if a.name}
        return {n: i for n, i in names.items() if n not in assigned}
    if kind == "with_columns_renamed":
        renames = {r.new_col_name: r.col_name for r in message.renames}
        renames.update({new: old for old, new in message.rename_columns_map.items()})
        before = set(renames.values())
        return {renames.get(n, n): i for n, i in names.items() if n in renames or n not in before}
    if kind in ("to_df", "map_partitions"):  # columns by position, or new ones
        return {}
    return dict(names)  # filter, alias, watermark, hint, drop: the same columns


def _projected(expressions: Any, name: str) -> str | None:
    """What the input calls the projection's output column `name`; None if it is computed."""
    for e in expressions:
        kind = e.WhichOneof("expr_type")
        if kind == "alias" and list(e.alias.name)[-1:] == [name]:
            return _column(e.alias.expr)
        if _column(e) == name:
            return name
    if any(e.WhichOneof("expr_type") == "unresolved_star" for e in expressions):
        return name
    return None


def _column(expression: Any) -> str | None:
    """The column a plain reference (or a sort order over one) names; None for anything else."""
    kind = expression.WhichOneof("expr_type")
    if kind == "sort_order":
        return _column(expression.sort_order.child)
    if kind != "unresolved_attribute":
        return None
    return str(expression.unresolved_attribute.unparsed_identifier).rsplit(".", 1)[-1].strip("`")


def _inputs(message: Any, relation: Any) -> list[Any]:
    """The relations a relation reads: its input, a join's two sides, a union's."""
    if message is None:
        return []
    fields = message.DESCRIPTOR.fields
    kept = [f.name for f in fields if f.message_type is relation.DESCRIPTOR and not f.is_repeated]
    return [getattr(message, name) for name in kept if message.HasField(name)]


def _title(kind: str | None) -> str:
    return "".join(part.title() for part in (kind or "unknown").split("_"))


# -- classic: the analyzed plan over py4j --------------------------------------------------------------


def _classic(plan: Any) -> Node:
    name = plan.nodeName()
    children = tuple(_classic(c) for c in _seq(plan.children()))
    if name == "StreamingRelationV2":
        options = {str(k).lower(): str(v) for k, v in plan.extraOptions().items()}
        return Node(name, children, source=source_name(str(plan.sourceName())), options=options)
    if name == "Repartition":
        return Node(name, children, partitions=plan.numPartitions(), shuffle=plan.shuffle())
    if name == "RepartitionByExpression":
        # By hash (columns) or by range (columns' sort orders): equal values land in one partition.
        columns = [e.child() if _kind(e) == "SortOrder" else e for e in _seq(plan.partitionExpressions())]
        plain = all(_kind(c) == "AttributeReference" for c in columns)
        by = tuple(c.exprId().id() for c in columns) if plain else None
        return Node(name, children, partitions=plan.numPartitions(), by=by)
    return Node(name, children)


def _kind(expression: Any) -> str:
    return str(expression.getClass().getSimpleName())


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


# -- classic: what Spark planned a batch's tasks to read -------------------------------------------------


def planned_tasks(batch: Any) -> list[tuple[str, Any]] | None:
    """What each task of a foreachBatch batch was planned to read (direct.Planned), in task order:
    Spark's Kafka source's range, or kafka_rc's pickled partition; None where that cannot be read
    (Spark Connect, a union, a source of another kind). A batch's frame is a LogicalRDD: its RDD's
    lineage ends in the source's DataSourceRDD, whose partitions hold each task's InputPartition."""
    try:
        found = _source_rdds(batch._jdf.queryExecution().logical().rdd())
        if len(found) != 1:
            return None
        parts = found[0].partitions()
        if len(parts) == 0:
            return []
        first = parts[0].inputPartition().get()
        kind = first.getClass().getSimpleName()
        if kind == "KafkaBatchInputPartition":
            return [_kafka_range(str(part.inputPartition())) for part in parts]
        if kind == "PythonStreamingInputPartition":
            return [("python", bytes(part.inputPartition().get().pickedPartition())) for part in parts]
    except Exception:  # the JVM's internals moved: Spark's own rows, as before
        return None
    return None


# A task's partition as its text says it, two round trips where its fields took fourteen (a second
# a batch at 1,000 partitions): Some(KafkaBatchInputPartition(KafkaOffsetRange(topic-partition,from,
# until,location),{the consumer's settings},pollTimeoutMs,failOnDataLoss,includeHeaders)). Topic names
# hold only [a-zA-Z0-9._-], the partition is the number after the last dash, and the settings, which
# may hold anything, are passed over: the range is read from the start, the rest from the end.
_KAFKA_RANGE = re.compile(
    r"Some\(KafkaBatchInputPartition\(KafkaOffsetRange\(([A-Za-z0-9._-]+)-(\d+),(-?\d+),(-?\d+),"
)
_KAFKA_TAIL = re.compile(r",(\d+),(true|false),(?:true|false)\)\)$")


def _kafka_range(text: str) -> tuple[str, Any]:
    at, tail = _KAFKA_RANGE.match(text), _KAFKA_TAIL.search(text)
    if at is None or tail is None:
        raise ValueError("not a Kafka partition's text")  # Spark's rows, as for any surprise
    return "kafka", (at[1], int(at[2]), int(at[3]), int(at[4]), int(tail[1]), tail[2] == "true")


def _source_rdds(rdd: Any) -> list[Any]:
    if rdd.getClass().getSimpleName() == "DataSourceRDD":
        return [rdd]
    found = []
    deps = rdd.dependencies().iterator()
    while deps.hasNext():
        found += _source_rdds(deps.next().rdd())
    return found
