"""The sink's SQL around the statements that apply a batch: the stage table, the batch record
and the ledger, built with psycopg.sql so every name is quoted.

The stage table holds one batch: the written columns as c0..cN (so no user
column name can clash with the sink's own), the Kafka position, the delete
flag, the task attempt that wrote the row, and for rows that could not be
converted, the error and the raw record.

`Bookkeeping` also holds what every statement of one sink is built from (its
quoted names, columns and keys); statements.py builds the applying ones on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from outbox.core import tables
from outbox.core.sqltext import Query, bindable
from sinks.postgres.plan import Plan
from sinks.postgres.spec import SinkSpec

__all__ = ["ATTEMPT_SETTING", "META", "Bookkeeping", "Names", "listed"]

ATTEMPT_SETTING = "outbox_sink.attempt"
META = ("_topic", "_partition", "_offset", "_delete")  # COPY order after the data columns


@dataclass(frozen=True)
class Names:
    """Quoted names for one sink."""

    target: sql.Identifier
    stage: sql.Identifier
    progress: sql.Identifier
    dead: sql.Identifier
    outbox: sql.Identifier
    batches: sql.Identifier
    traces: sql.Identifier
    rounds: sql.Identifier  # a batch's events numbered per key, when they go in rounds

    @classmethod
    def of(cls, spec: SinkSpec, *, in_task: bool = False, lane: int | None = None) -> Names:
        """in_task: the stage is the task's own temp table, not the batch's table shared by tasks.
        lane: the table's place among a routed sink's tables, each staged apart (routing.py)."""
        digest = hashlib.sha1(spec.name.encode()).hexdigest()[:16]
        ledger = spec.ledger_schema
        suffix = "" if lane is None else f"_{lane}"
        stage = sql.Identifier(
            *(
                ("pg_temp", "sink_task" + suffix)
                if in_task
                else (ledger, tables.SINK_STAGE_PREFIX + digest + suffix)
            )
        )
        return cls(
            target=sql.Identifier(spec.schema, spec.table),
            stage=stage,
            progress=sql.Identifier(ledger, tables.SINK_PROGRESS),
            dead=sql.Identifier(ledger, tables.SINK_DEAD_LETTERS),
            outbox=sql.Identifier(ledger, tables.OUTBOX_EVENTS),
            batches=sql.Identifier(ledger, tables.SINK_BATCHES),
            traces=sql.Identifier(ledger, tables.SINK_TRACES),
            rounds=sql.Identifier("sink_rounds" + suffix),
        )


def listed(items: Sequence[sql.Composable]) -> sql.Composed:
    return sql.SQL(", ").join(items)


class Bookkeeping:
    """What every statement of one sink is built from, and those that stage, record and move the ledger."""

    def __init__(self, spec: SinkSpec, plan: Plan, *, in_task: bool = False, lane: int | None = None) -> None:
        """lane: one table of a routed sink; its statements leave the ledger alone, for it moves once
        for all the tables, after them (`move_ledger`): each table's statement reads it as it was."""
        self.spec = spec
        self.in_task = in_task
        self.lane = lane
        self.names = Names.of(spec, in_task=in_task, lane=lane)
        self.columns = plan.columns
        self.no_equality = plan.no_equality
        self.targets = [sql.Identifier(c) for c in plan.columns]
        self.staged = [sql.Identifier(f"c{i}") for i in range(len(plan.columns))]
        position = {c: i for i, c in enumerate(plan.columns)}
        self.keys = [self.staged[position[k]] for k in spec.key]
        self.target_keys = [sql.Identifier(k) for k in spec.key]
        self.version = (
            (sql.Identifier(spec.version), self.staged[position[spec.version]]) if spec.version else None
        )
        self.unapplied = False  # see Statements.past_ledger

    # -- staging ---------------------------------------------------------------------------------------

    def create_stage(self, attempt: int | None = None) -> Query:
        """attempt: a task's, each row's default in its own stage, a constant; else each row takes its
        stager's setting for the transaction (stage.py), which PostgreSQL reads again for every row."""
        n = self.names
        data = listed(
            [sql.SQL("t.{} AS {}").format(t, s) for t, s in zip(self.targets, self.staged, strict=True)]
        )
        create = sql.SQL(
            "CREATE TEMP TABLE {stage} ON COMMIT DROP" if self.in_task else "CREATE UNLOGGED TABLE {stage}"
        ).format(stage=n.stage)
        return sql.SQL(
            "DROP TABLE IF EXISTS {stage};"
            " {create} AS SELECT {data}, NULL::text AS _topic,"
            " NULL::integer AS _partition, NULL::bigint AS _offset, NULL::boolean AS _delete,"
            " NULL::bigint AS _attempt, NULL::text AS _error,"
            " NULL::bytea AS _raw_key, NULL::bytea AS _raw_value FROM {target} AS t WITH NO DATA;"
            " ALTER TABLE {stage} ALTER COLUMN _attempt SET DEFAULT {attempt}"
        ).format(
            stage=n.stage,
            create=create,
            data=data,
            target=n.target,
            attempt=sql.SQL("current_setting({})::bigint").format(sql.Literal(ATTEMPT_SETTING))
            if attempt is None
            else sql.SQL("{}::bigint").format(sql.Literal(attempt)),
        )

    def drop_stage(self) -> Query:
        return sql.SQL("DROP TABLE IF EXISTS {}").format(self.names.stage)

    def copy_rows(self) -> Query:
        columns = [*self.staged, *(sql.Identifier(m) for m in META)]
        return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(self.names.stage, listed(columns))

    def copy_dead(self) -> Query:
        return sql.SQL(
            "COPY {} (_topic, _partition, _offset, _delete, _error, _raw_key, _raw_value) FROM STDIN"
        ).format(self.names.stage)

    def first_error(self) -> Query:
        """The first record that did not parse, of those the ledger has not applied (a replay holds
        applied ones, perhaps dead-lettered by an earlier run: they are passed over, as every
        applied record is)."""
        return bindable(
            sql.SQL(
                "SELECT _topic, _partition, _offset, _error FROM {stage} AS s WHERE _error IS NOT NULL"
                " AND _attempt = ANY(%(attempts)s) AND _offset >= coalesce((SELECT next_offset FROM"
                " {progress} AS p WHERE p.sink = %(sink)s AND p.topic = s._topic"
                " AND p.kafka_partition = s._partition), 0)"
                " ORDER BY _topic, _partition, _offset LIMIT 1"
            ).format(stage=self.names.stage, progress=self.names.progress)
        )

    def emptied(self) -> Query:
        """Whether the table is empty while the ledger says the sink applied offsets to it: truncated
        or made again to be rebuilt, which a query from earliest would not do (the ledger skips all)."""
        return bindable(
            sql.SQL(
                "SELECT NOT EXISTS (SELECT FROM {}) AND EXISTS (SELECT FROM {} WHERE sink = %(sink)s"
                " AND next_offset > 0)"
            ).format(self.names.target, self.names.progress)
        )

    # -- the batch record (continuity.py) ---------------------------------------------------------------

    def last_batch(self) -> Query:
        return bindable(
            sql.SQL("SELECT batch_id FROM {} WHERE sink = %(sink)s AND query_id = %(query)s").format(
                self.names.batches
            )
        )

    def record_batch(self) -> Query:
        return bindable(
            sql.SQL(
                "INSERT INTO {} AS b (sink, query_id, batch_id) VALUES (%(sink)s, %(query)s, %(batch)s)"
                " ON CONFLICT (sink, query_id) DO UPDATE SET batch_id = EXCLUDED.batch_id, updated_at = now()"
            ).format(self.names.batches)
        )

    def report_batch(self) -> Query:
        """The recorded batch's outcome (a BatchResult as JSON), once it committed: for any client."""
        return bindable(
            sql.SQL(
                "UPDATE {} SET result = %(result)s::jsonb"
                " WHERE sink = %(sink)s AND query_id = %(query)s AND batch_id = %(batch)s"
            ).format(self.names.batches)
        )

    def reported(self) -> Query:
        return bindable(
            sql.SQL("SELECT result FROM {} WHERE sink = %(sink)s AND query_id = %(query)s").format(
                self.names.batches
            )
        )

    # -- the ledger --------------------------------------------------------------------------------------

    def claim(self) -> Query:
        """Ledger rows for the task's topic-partitions (%(topics)s, %(partitions)s) that have none
        yet, so that `lock` finds them all."""
        return bindable(
            sql.SQL(
                "INSERT INTO {} (sink, topic, kafka_partition, next_offset) SELECT %(sink)s, t, p, 0"
                " FROM unnest(%(topics)s::text[], %(partitions)s::int[]) AS held (t, p) ORDER BY t, p"
                " ON CONFLICT (sink, topic, kafka_partition) DO NOTHING"
            ).format(self.names.progress)
        )

    def lock(self) -> Query:
        """Lock the task's topic-partitions' ledger rows, in one order: another attempt of the
        same rows waits here, then finds them applied. (topic, partition, next_offset) each."""
        return bindable(
            sql.SQL(
                "SELECT topic, kafka_partition, next_offset FROM {} WHERE sink = %(sink)s"
                " AND (topic, kafka_partition) IN"
                " (SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::int[]))"
                " ORDER BY topic, kafka_partition FOR UPDATE"
            ).format(self.names.progress)
        )

    def _advance(self, rows: sql.Composable) -> sql.Composable:
        """Move the ledger to `rows` (sink, topic, partition, next offset), never back."""
        return sql.SQL(
            "INSERT INTO {progress} AS p (sink, topic, kafka_partition, next_offset) {rows}"
            " ON CONFLICT (sink, topic, kafka_partition) DO UPDATE"
            " SET next_offset = GREATEST(p.next_offset, EXCLUDED.next_offset), updated_at = now()"
        ).format(progress=self.names.progress, rows=rows)

    def move_ledger(self) -> Query:
        """A routed sink's ledger moved once, after its tables: to each topic-partition's next offset
        (%(topics)s, %(partitions)s, %(ends)s), past the records no table took too."""
        return bindable(
            self._advance(
                sql.SQL(
                    "SELECT %(sink)s, t, p, o FROM unnest(%(topics)s::text[], %(partitions)s::int[],"
                    " %(ends)s::bigint[]) AS e (t, p, o)"
                )
            )
        )
