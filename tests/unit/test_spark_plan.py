"""The Spark Connect glue: a client's proto plan to the `Node` tree `route` judges (no server)."""

from __future__ import annotations

from pyspark.sql.connect.proto import expressions_pb2 as ex
from pyspark.sql.connect.proto import relations_pb2 as rel

from sinks.postgres.placement import route
from sinks.postgres.spark_plan import POSITION, node


def column(name: str) -> ex.Expression:
    return ex.Expression(unresolved_attribute=ex.Expression.UnresolvedAttribute(unparsed_identifier=name))


def source(**options: str) -> rel.Relation:
    read = rel.Read(data_source=rel.Read.DataSource(format="kafka_rc", options=options), is_streaming=True)
    return rel.Relation(read=read)


def by(frame: rel.Relation, *names: str) -> rel.Relation:
    exprs = [column(n) for n in names]
    return rel.Relation(
        repartition_by_expression=rel.RepartitionByExpression(
            input=frame, partition_exprs=exprs, num_partitions=3
        )
    )


def select(frame: rel.Relation, **renamed: str) -> rel.Relation:
    """SELECT each `old AS new` of `renamed` (new=old)."""
    exprs = [
        ex.Expression(alias=ex.Expression.Alias(expr=column(old), name=[new])) for new, old in renamed.items()
    ]
    return rel.Relation(project=rel.Project(input=frame, expressions=exprs))


def tasks(frame: rel.Relation) -> bool:
    return route(node(frame, dict(POSITION)), frozenset(POSITION.values())).tasks


def test_columns_are_followed_through_renames() -> None:
    renamed = by(select(source(), t="topic", p="partition"), "t", "p")
    assert tasks(select(renamed, topic="t", partition="p"))
    # The frame's `partition` is another column than the one the shuffle was by.
    assert not tasks(select(by(source(), "topic", "partition"), topic="topic", partition="offset"))


def test_a_shuffling_hint_or_a_source_option_sends_batches_to_the_driver() -> None:
    assert tasks(source())
    assert not tasks(source(minPartitions="4"))
    hint = rel.Relation(hint=rel.Hint(input=source(), name="REPARTITION"))
    assert not tasks(hint)
    assert tasks(rel.Relation(hint=rel.Hint(input=source(), name="broadcast")))
