"""One sink query into several tables, each row's table chosen by a column (PostgresSink.routed).

Each table is a lane: its own key, version, delete rule, columns and stage.
A task copies each lane's rows into that lane's stage and applies the lanes
one after another in its one transaction; the ledger is read once under its
lock and moved once, after them all (bookkeeping.move_ledger), so no table is
ever ahead of another. Rows that did not parse, and rows no table takes
(unless told to ignore them), are dead letters, staged with the first lane.

The split is plain Arrow (`Lanes.split`), tested alone; columns.py builds the
columns it reads (`routed_columns`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from sinks.errors import error
from sinks.postgres import settings as S
from sinks.postgres.settings import Mode, Outbox

Unrouted = Literal["dead_letter", "ignore"]
UNROUTED: tuple[Unrouted, ...] = ("dead_letter", "ignore")
Delete = Literal["tombstone"] | str | Column | None

ROUTE = "_route"  # the row's route value, as text
SHARED = ("_topic", "_partition", "_offset", "_raw_key", "_raw_value", "_parse_error")
# A lane's batch, as stage.copy_batch reads it: data c0..cN, then these.
LANE_TAIL = ("_topic", "_partition", "_offset", "_delete", "_raw_key", "_raw_value", "_parse_error")


@dataclass(frozen=True)
class Table:
    """One table of a routed sink: the keywords PostgresSink takes for its one table.

    columns: the frame's fields this table takes (default: those it has); with
    `create` or `evolve` name them, for the frame carries every route's fields.
    """

    name: str
    key: str | Sequence[str] = S.KEY.default
    schema: str = S.SCHEMA.default
    mode: Mode = S.MODE.default
    version: str | None = S.VERSION.default
    delete: Delete = S.DELETE.default
    outbox: Outbox | None = S.OUTBOX.default
    create: bool = S.CREATE.default
    evolve: bool = S.EVOLVE.default
    columns: Sequence[str] | None = None


def header(name: str) -> Column:
    """A Kafka header's value as text, to route by (the source's `includeHeaders` must be on);
    null where the record has no such header."""
    named = F.filter(F.col("headers"), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(named, F.lit(1))["value"].cast("string")


@dataclass(frozen=True)
class Routing:
    """What PostgresSink.routed was given, checked: the route column and each value's table."""

    by: str | Column
    tables: Mapping[str, Table]
    unrouted: Unrouted = "dead_letter"
    described: str = field(init=False)  # the route, as the dead letters' line names it

    def __post_init__(self) -> None:
        if not self.tables:
            raise error("SINK_ROUTES_EMPTY")
        if self.unrouted not in UNROUTED:
            raise error("SINK_UNROUTED_NOT_A_CHOICE", got=self.unrouted, choices=list(UNROUTED))
        seen: dict[tuple[str, str], str] = {}
        for value, table in self.tables.items():
            where = (table.schema, table.name)
            if where in seen:
                raise error("SINK_ROUTED_TABLE_REPEATS", table=".".join(where), values=[seen[where], value])
            seen[where] = value
            if (table.create or table.evolve) and table.columns is None:
                raise error("SINK_ROUTE_NEEDS_COLUMNS", table=".".join(where))
        object.__setattr__(self, "described", self.by if isinstance(self.by, str) else "the route column")

    def column(self) -> Column:
        by = F.col("`" + self.by.replace("`", "``") + "`") if isinstance(self.by, str) else self.by
        return by.cast("string").alias(ROUTE)


@dataclass(frozen=True)
class Lanes:
    """A routed sink's lanes as a task sees them (pickled): each one's route value and data width."""

    values: tuple[str, ...]
    widths: tuple[int, ...]  # data columns per lane: l{i}_c0 .. l{i}_c{width-1}
    unrouted: Unrouted
    described: str

    def split(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """Each lane's rows of `batch` in the layout its stage takes; the first lane also takes
        the rows that did not parse and, unless ignored, those no table takes, as dead letters."""
        route, parse_error = batch.column(ROUTE), batch.column("_parse_error")
        parsed = pc.is_null(parse_error)
        known = pc.fill_null(pc.is_in(route, value_set=pa.array(self.values, pa.string())), False)
        stray = pc.invert(parsed)
        if self.unrouted == "dead_letter":
            stray = pc.or_(stray, pc.invert(known))
            why = pc.binary_join_element_wise(
                f"routed by {self.described}: no table takes ",
                pc.fill_null(pc.utf8_slice_codeunits(route, 0, 200), "null"),
                "",
            )
            parse_error = pc.if_else(pc.and_(parsed, pc.invert(known)), why, parse_error)
        lanes = []
        for i, (value, width) in enumerate(zip(self.values, self.widths, strict=True)):
            mine = pc.and_(parsed, pc.fill_null(pc.equal(route, value), False))
            if i == 0:
                mine = pc.or_(mine, stray)
            data = [batch.column(f"l{i}_c{j}") for j in range(width)]
            shared = [batch.column(n) for n in ("_topic", "_partition", "_offset")]
            tail = [batch.column(f"l{i}_delete"), batch.column("_raw_key"), batch.column("_raw_value")]
            columns = [*data, *shared, *tail, parse_error]
            names = [*(f"c{j}" for j in range(width)), *LANE_TAIL]
            lanes.append(pa.RecordBatch.from_arrays(columns, names).filter(mine))
        return lanes
