"""The tables a writer applies to, each a lane: made or evolved if asked, then planned against the
frame at start. A sink has one; a routed sink one per table (routing.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from pyspark.sql import types as T

from sinks.errors import error
from sinks.postgres import evolve
from sinks.postgres.catalog import describe
from sinks.postgres.plan import ERROR_COLUMN, KAFKA_COLUMNS, Plan, plan
from sinks.postgres.routing import Delete, Routing, Table
from sinks.postgres.spec import SinkSpec
from sinks.postgres.stage import StageJob
from sinks.postgres.statements import Statements

__all__ = ["Lane", "planned_lane", "spec_keywords", "stage_job", "table_keywords", "wanted"]

log = logging.getLogger("sinks.postgres")


@dataclass(frozen=True)
class Lane:
    """One table the writer applies to: the sink's one, or one of a routed sink's (routing.py)."""

    spec: SinkSpec
    plan: Plan
    statements: Statements  # the driver's, on the shared stage
    in_task: Statements  # a task's, on its own temp stage


def wanted(
    spec: SinkSpec, delete: Delete, routing: Routing | None
) -> list[tuple[SinkSpec, Delete, Sequence[str] | None]]:
    """Each table's spec, delete rule and the frame's fields it names (routing.Table.columns)."""
    if routing is None:
        return [(spec, delete, None)]
    return [
        (replace(spec, table=t.name, **spec_keywords(t)), t.delete, t.columns)
        for t in routing.tables.values()
    ]


def planned_lane(
    conn: psycopg.Connection,
    schema: T.StructType,
    spec: SinkSpec,
    delete: Delete,
    columns: Sequence[str] | None,
    lane: int | None,
) -> Lane:
    """The table's lane: made or evolved first if asked, then planned against the frame's fields
    it takes (a routed table's named ones, else those it has)."""
    if columns:
        absent = [c for c in columns if c not in schema.fieldNames()]
        if absent:
            raise error(
                "SINK_ROUTED_COLUMNS_ABSENT",
                table=f"{spec.schema}.{spec.table}",
                columns=absent,
                fields=schema.fieldNames(),
            )
        schema = _only(schema, set(columns))
    if spec.create or spec.evolve:
        conn.commit()  # the DDL commits on its own, before any batch
        for change in evolve.prepare(conn, spec, schema):
            log.warning("sink %s: %s", spec.name, change)
    table = describe(conn, spec.schema, spec.table)
    if lane is not None and not columns:  # a routed table without columns=: the fields it has
        schema = _only(schema, set(table.columns))
    found = plan(schema, table, spec)
    return Lane(
        spec, found, Statements(spec, found, lane=lane), Statements(spec, found, in_task=True, lane=lane)
    )


def _only(schema: T.StructType, names: set[str]) -> T.StructType:
    """The frame's fields among `names`, with Kafka's own columns and the parse error."""
    kept = names | KAFKA_COLUMNS | {ERROR_COLUMN}
    return T.StructType([f for f in schema.fields if f.name in kept])


def spec_keywords(table: Table) -> dict[str, Any]:
    """A routed table's own SinkSpec fields."""
    key = (table.key,) if isinstance(table.key, str) else tuple(table.key)
    return {
        "schema": table.schema,
        "key": key,
        "mode": table.mode,
        "version": table.version,
        "outbox": table.outbox,
        "create": table.create,
        "evolve": table.evolve,
    }


def table_keywords(table: Table) -> dict[str, Any]:
    """A routed table's own PostgresSink keywords."""
    return {**spec_keywords(table), "key": table.key, "delete": table.delete}


def stage_job(conn: psycopg.Connection, lane: Lane, st: Statements) -> StageJob:
    """What a task needs to COPY into `st`'s stage; token set per batch run."""
    return StageJob(
        copy_rows=st.copy_rows().as_bytes(conn),
        copy_dead=st.copy_dead().as_bytes(conn),
        keys=tuple(lane.plan.columns.index(k) for k in lane.spec.key),
        names=lane.plan.columns,
        token=0,
    )
