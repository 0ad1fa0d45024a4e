"""The SQL the sink runs, built with psycopg.sql so every name is quoted.

The stage table holds one batch: the written columns as c0..cN (so no user
column name can clash with the sink's own), the Kafka position, the delete
flag, the task attempt that wrote the row, and for rows that could not be
converted, the error and the raw record.

The rule a batch follows: the table ends as if its events had been applied
one by one, in offset order per topic-partition. When each key has at most
one event in the batch, one statement does it all, its common table
expressions sharing one snapshot: rows already in the ledger are skipped,
deletes and upserts apply, outbox events and dead letters are inserted, the
ledger moves. Otherwise the events are numbered into rounds (a key's first
event in round 1, its second in round 2, ...) and applied round after round,
so every event meets the row its predecessor left. Which it is, a batch
without deletes learns from its one statement (`apply`), which is undone when
a key had several events; a batch with deletes asks first (`rounds`). A task
that finds no row of its own stage in the ledger reads it without the ledger
(`past_ledger`), and one whose rows hold no delete or no dead letter runs no
DELETE or no dead-letter scan (`apply`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg import sql

from outbox.core import tables
from outbox.core.sqltext import Query, bindable, user_sql
from outbox.core.trace import key_text_sql, outbox_event_id_sql
from sinks.postgres.plan import Plan
from sinks.postgres.spec import SinkSpec

ATTEMPT_SETTING = "outbox_sink.attempt"
META = ("_topic", "_partition", "_offset", "_delete")  # COPY order after the data columns
_WHOLE_BATCH = sql.SQL("0")  # the round of a batch applied in one statement


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


def _list(items: Sequence[sql.Composable]) -> sql.Composed:
    return sql.SQL(", ").join(items)


def _count(cte: str) -> sql.Composable:
    return sql.SQL("(SELECT count(*) FROM {})").format(sql.Identifier(cte))


_STAGED_COUNTS = [
    sql.SQL("(SELECT coalesce(sum({}), 0)::bigint FROM staged)").format(sql.Identifier(c))
    for c in ("present", "fresh")
]
_LATEST = _count("latest")
# The records of `latest` in a statement that has `staged` and `dead`: the fresh rows but the dead
# letters, counted without a scan of their own.
_LATEST_OF_FRESH = sql.SQL("{} - {}").format(_STAGED_COUNTS[1], _count("dead"))


def _unless_all_changed(
    asked: sql.Composable, otherwise: int, records: sql.Composable = _LATEST
) -> sql.Composable:
    """`asked`, run only when one of the `records` of `latest` changed nothing (PostgreSQL runs
    the subquery of a CASE branch only when the branch is taken); `otherwise` when every one did."""
    return sql.SQL("CASE WHEN {} + {} < {} THEN {} ELSE {} END").format(
        _count("upserted"), _count("deleted"), records, asked, sql.Literal(otherwise)
    )


class Statements:
    """Every statement of one sink, from its spec and plan."""

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
        self.unapplied = False  # see past_ledger

    def past_ledger(self) -> Statements:
        """These statements for a task's stage whose every row is past the ledger, as the task found
        holding its ledger rows' locks (task.py): the stage is read as it is, not joined to the
        ledger row by row, which cost a fifth of the applying statement."""
        assert self.in_task, "a shared stage holds other attempts' rows"
        lean = copy.copy(self)
        lean.unapplied = True
        return lean

    # -- staging ---------------------------------------------------------------------------------------

    def create_stage(self, attempt: int | None = None) -> Query:
        """attempt: a task's, each row's default in its own stage, a constant; else each row takes its
        stager's setting for the transaction (stage.py), which PostgreSQL reads again for every row."""
        n = self.names
        data = _list(
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
        return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(self.names.stage, _list(columns))

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

    # -- applying ----------------------------------------------------------------------------------------

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

    def rounds(self) -> Query:
        """How many events the busiest key has in this batch: 1 (or 0) means one statement applies it."""
        keys = _list(self.keys)
        return self._with(
            [self._staged(), self._fresh()],
            [
                sql.SQL(
                    "coalesce((SELECT max(c) FROM (SELECT count(*) AS c FROM fresh WHERE _error IS NULL"
                    " GROUP BY {}) AS k), 0)"
                ).format(keys)
            ],
        )

    def deletes(self) -> Query:
        """Whether the batch has a delete: a key's delete and its other events never share a
        statement, so such a batch is asked `rounds` first."""
        return bindable(
            sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE _delete AND _attempt = ANY(%(attempts)s))").format(
                self.names.stage
            )
        )

    def apply(self, *, deletes: bool, dead_letters: bool = True) -> Query:
        """The batch in one statement: (present, fresh, upserted, deleted, dead, stale, most).

        deletes: whether a staged row may be a delete; dead_letters: whether one may be a dead letter.
        Where the caller knows neither is so, the statement runs no DELETE and no scan for them.

        most: the most events one key has in the batch, counted in a batch without deletes, 1 in
        one with (it was asked first: `rounds`). It is counted only when a record changed nothing:
        a key met twice either makes the statement fail (ON CONFLICT DO UPDATE touches a row once)
        or leaves a record that changed nothing. Above 1, the caller undoes the statement.
        """
        # Past the ledger, the stage is read again by each reader of `latest`: cheaper than a copy.
        kept = sql.SQL(" NOT MATERIALIZED" if self.unapplied else "")
        latest = sql.SQL("latest AS{} (SELECT * FROM fresh WHERE _error IS NULL)").format(kept)
        ctes = [
            self._staged(),
            self._fresh(),
            latest,
            *self._changes(deletes=deletes),
            *self._finish(dead_letters),
        ]
        counts = [
            *_STAGED_COUNTS,
            *map(_count, ["upserted", "deleted", "dead"]),
            self._stale(_LATEST_OF_FRESH),
        ]
        most = _unless_all_changed(
            sql.SQL(
                "coalesce((SELECT max(c) FROM (SELECT count(*) AS c FROM latest GROUP BY {}) AS k), 0)"
            ).format(_list(self.keys)),
            1,
            _LATEST_OF_FRESH,
        )
        return self._with(ctes, [*counts, sql.SQL("1") if deletes else most])

    def materialize_rounds(self) -> Query:
        """The rows to apply, in a temp table: _round is the event's place among its key's events,
        _n its place in the round."""
        keys = _list(self.keys)
        return bindable(
            sql.SQL(
                "CREATE TEMP TABLE {rounds} ON COMMIT DROP AS WITH {ctes}"
                " SELECT row_number() OVER (PARTITION BY _round ORDER BY {keys}) AS _n, * FROM"
                " (SELECT row_number() OVER (PARTITION BY {keys} ORDER BY _topic, _partition, _offset)"
                " AS _round, * FROM fresh WHERE _error IS NULL) AS r"
            ).format(rounds=self.names.rounds, ctes=_list([self._staged(), self._fresh()]), keys=keys)
        )

    def index_rounds(self) -> Query:
        """Each round and each half of one is read by an index, not by a scan of the whole batch."""
        return sql.SQL("CREATE INDEX ON {r} (_round, _n); ANALYZE {r}").format(r=self.names.rounds)

    def round_sizes(self) -> Query:
        return sql.SQL("SELECT _round, count(*) FROM {} GROUP BY _round ORDER BY _round").format(
            self.names.rounds
        )

    def apply_range(self) -> Query:
        """Rows _n in [lo, hi] of round `round`: (upserted, deleted, stale) counts."""
        latest = sql.SQL(
            "latest AS (SELECT * FROM {} WHERE _round = %(round)s AND _n BETWEEN %(lo)s AND %(hi)s)"
        ).format(self.names.rounds)
        changes = self._changes(sql.SQL("%(round)s::int"))
        return self._with([latest, *changes], [_count("upserted"), _count("deleted"), self._stale()])

    def dead_letter_row(self) -> Query:
        """A row the table refused: its key as text and the row as JSON (the raw record stays in Kafka)."""
        pairs = _list(
            [
                sql.SQL("{}, {}").format(sql.Literal(c), s)
                for c, s in zip(self.columns, self.staged, strict=True)
            ]
        )
        return bindable(
            sql.SQL(
                "INSERT INTO {dead} (sink, topic, kafka_partition, kafka_offset, key, value, error)"
                " SELECT %(sink)s, _topic, _partition, _offset,"
                " coalesce(_raw_key, convert_to({key}, 'UTF8')),"
                " coalesce(_raw_value, convert_to(jsonb_build_object({pairs})::text, 'UTF8')), %(error)s"
                " FROM {rounds} AS r WHERE _round = %(round)s AND _n = %(n)s"
            ).format(
                dead=self.names.dead, rounds=self.names.rounds, key=self._event("r", self.keys), pairs=pairs
            )
        )

    def finish(self) -> Query:
        """The fallback's last step: dead letters from staging and the ledger: (present, fresh, dead)."""
        ctes = [self._staged(), self._fresh(), *self._finish()]
        return self._with(ctes, [*_STAGED_COUNTS, _count("dead")])

    def _with(self, ctes: list[sql.Composable], selects: list[sql.Composable]) -> Query:
        return bindable(sql.SQL("WITH {} SELECT {}").format(_list(ctes), _list(selects)))

    def _staged(self) -> sql.Composable:
        """Per topic-partition: rows staged, of those not yet applied, where the ledger and the batch end.

        Counting comes with the scan that moves the ledger, so checking that the
        stage is whole costs no scan of its own.
        """
        if self.unapplied:
            return sql.SQL(
                "staged AS (SELECT _topic, _partition, count(*) AS present, count(*) AS fresh,"
                " max(_offset) + 1 AS next_offset FROM {stage} GROUP BY _topic, _partition)"
            ).format(stage=self.names.stage)
        return sql.SQL(
            "staged AS (SELECT s._topic, s._partition, count(*) AS present,"
            " count(*) FILTER (WHERE s._offset >= coalesce(p.next_offset, 0)) AS fresh,"
            " coalesce(max(p.next_offset), 0) AS applied, max(s._offset) + 1 AS next_offset"
            " FROM {stage} AS s LEFT JOIN {progress} AS p ON p.sink = %(sink)s"
            " AND p.topic = s._topic AND p.kafka_partition = s._partition"
            " WHERE s._attempt = ANY(%(attempts)s) GROUP BY s._topic, s._partition)"
        ).format(stage=self.names.stage, progress=self.names.progress)

    def _fresh(self) -> sql.Composable:
        # Not materialized: its readers (latest, rounds, dead) each filter their own scan of
        # the stage, instead of every row being copied into a tuplestore first. The
        # ledger comes through `staged`, one row per partition: the stage table has
        # no statistics, and joined to the ledger directly it got a nested loop.
        if self.unapplied:  # a task's own stage: every row its attempt's, and past the ledger
            return sql.SQL("fresh AS NOT MATERIALIZED (SELECT * FROM {stage})").format(stage=self.names.stage)
        return sql.SQL(
            "fresh AS NOT MATERIALIZED (SELECT s.* FROM {stage} AS s JOIN staged AS g"
            " ON g._topic = s._topic AND g._partition = s._partition"
            " WHERE s._attempt = ANY(%(attempts)s) AND s._offset >= g.applied)"
        ).format(stage=self.names.stage)

    def _match(self) -> sql.Composable:
        """A staged record `l` and the row `t` of its key."""
        return sql.SQL(" AND ").join(
            sql.SQL("t.{} = l.{}").format(t, s) for t, s in zip(self.target_keys, self.keys, strict=True)
        )

    def _stale(self, records: sql.Composable = _LATEST) -> sql.Composable:
        """Of the records that changed nothing, those whose row held a newer version: the row as the
        statement found it, one record per key. Only looked for when a record changed nothing."""
        if not self.version:
            return sql.SQL("0::bigint")
        target_v, staged_v = self.version
        return _unless_all_changed(
            sql.SQL(
                "(SELECT count(*) FROM latest AS l JOIN {target} AS t ON {match} WHERE t.{tv} > l.{sv})"
            ).format(target=self.names.target, match=self._match(), tv=target_v, sv=staged_v),
            0,
            records,
        )

    def _changes(
        self, round_: sql.Composable = _WHOLE_BATCH, *, deletes: bool = True
    ) -> list[sql.Composable]:
        """round_: the round being applied (0: the whole batch in one statement), for tracing.
        deletes: False where no staged row is a delete: `deleted` is then empty, with its columns."""
        n = self.names
        match = self._match()
        newer: sql.Composable = sql.SQL("")
        if self.version:
            target_v, staged_v = self.version
            newer = sql.SQL(" AND (l.{s} IS NULL OR t.{t} IS NULL OR t.{t} <= l.{s})").format(
                s=staged_v, t=target_v
            )
        # The outbox reads the written rows, the trace their keys; the counts need no column.
        if self.spec.outbox:
            returning: sql.Composable = sql.SQL("t.*")
        elif self.spec.trace:
            returning = _list([sql.SQL("t.{}").format(k) for k in self.target_keys])
        else:
            returning = sql.SQL("1")
        deleted = sql.SQL(
            "deleted AS (DELETE FROM {target} AS t USING latest AS l"
            " WHERE l._delete AND {match}{newer} RETURNING {returning})"
            if deletes
            else "deleted AS (SELECT {returning} FROM {target} AS t WHERE false)"
        ).format(target=n.target, match=match, newer=newer, returning=returning)

        changed = [c for c in self.columns if c not in self.spec.key]
        if self.spec.mode == "insert" or not changed:
            conflict: sql.Composable = sql.SQL("DO NOTHING")
        else:
            updates = [sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in changed]

            # A redelivered event leaves the row (and the outbox) untouched; an older version too.
            def side(alias: str) -> sql.Composed:
                return _list(
                    [
                        sql.SQL("{}.{}{}").format(
                            sql.SQL(alias),
                            sql.Identifier(c),
                            sql.SQL('::text COLLATE "C"' if c in self.no_equality else ""),
                        )
                        for c in changed
                    ]
                )

            guard: sql.Composable = sql.SQL("({}) IS DISTINCT FROM ({})").format(side("t"), side("EXCLUDED"))
            if self.version:
                guard = sql.SQL("{} AND (t.{v} IS NULL OR t.{v} <= EXCLUDED.{v})").format(
                    guard, v=self.version[0]
                )
            conflict = sql.SQL("DO UPDATE SET {} WHERE {}").format(_list(updates), guard)
        upserted = sql.SQL(
            "upserted AS (INSERT INTO {target} AS t ({columns}) SELECT {staged} FROM latest WHERE NOT _delete"
            " ON CONFLICT ({keys}) {conflict} RETURNING {returning})"
        ).format(
            target=n.target,
            columns=_list(self.targets),
            staged=_list(self.staged),
            keys=_list(self.target_keys),
            conflict=conflict,
            returning=returning,
        )
        return [
            deleted,
            upserted,
            *([self._outbox(round_)] if self.spec.outbox else []),
            *([self._traced(round_)] if self.spec.trace else []),
        ]

    def _event(self, alias: str, columns: list[sql.Identifier]) -> sql.Composable:
        """The event a row is traced under: its key as text (outbox/core/trace.py)."""
        return key_text_sql(sql.Identifier(alias), columns)

    def _traced(self, round_: sql.Composable) -> sql.Composable:
        """One row for the statement: each record it applied or skipped, in parallel arrays; the
        events of its deletes and of the rows it deleted; and those of the rows it wrote, unless it
        wrote one per upsert (NULL), as it does but for duplicates and stale versions. Outcomes are
        decided when a trace reads them (outbox/trace/outcomes.py). One row, no index."""
        version = (
            sql.SQL("array_agg(l.{}::text)").format(self.version[1]) if self.version else sql.SQL("NULL")
        )
        box = self.spec.outbox

        def events_of(cte: str) -> sql.Composable:
            return sql.SQL("coalesce((SELECT array_agg({}) FROM {} AS w), '{{}}')").format(
                self._event("w", self.target_keys), sql.Identifier(cte)
            )

        return sql.SQL(
            "traced AS (INSERT INTO {traces} (sink, txid, round, outbox_topic, topics, partitions, offsets,"
            " events, versions, written, deletes, removed)"
            " SELECT %(sink)s, pg_current_xact_id(), {round}, {outbox_topic}, array_agg(l._topic),"
            " array_agg(l._partition), array_agg(l._offset), array_agg({event}), {version},"
            " CASE WHEN (SELECT count(*) FROM upserted) < count(*) FILTER (WHERE NOT l._delete)"
            " THEN {written} END,"
            " coalesce(array_agg({event}) FILTER (WHERE l._delete), '{{}}'), {removed}"
            " FROM latest AS l HAVING count(*) > 0 RETURNING 1)"
        ).format(
            traces=self.names.traces,
            round=round_,
            outbox_topic=sql.Literal(box.topic if box else None),
            event=self._event("l", self.keys),
            version=version,
            written=events_of("upserted"),
            removed=events_of("deleted"),
        )

    def _outbox(self, round_: sql.Composable) -> sql.Composable:
        box = self.spec.outbox
        assert box is not None

        def utf8(expr: str | None) -> sql.Composable:
            if not expr:
                return sql.SQL("NULL::bytea")
            return sql.SQL("convert_to(({})::text, 'UTF8')").format(user_sql(expr))

        names = sql.Literal(list(box.headers))
        values = sql.SQL("ARRAY[{}]::bytea[]").format(_list([utf8(e) for e in box.headers.values()]))
        # Traced, an event's id is derived (outbox/core/trace.py): a trace computes it from what it read.
        event_id = (
            outbox_event_id_sql(key_text_sql(sql.Identifier("written"), self.target_keys), round_)
            if self.spec.trace
            else sql.SQL("gen_random_uuid()")
        )

        def select(source: str, value: sql.Composable) -> sql.Composable:
            return sql.SQL(
                "SELECT {event_id}, {topic}, {key}, {value}, {names}::text[], {values}"
                " FROM {source} AS written"
            ).format(
                event_id=event_id,
                topic=sql.Literal(box.topic),
                key=utf8(box.key),
                value=value,
                names=names,
                values=values,
                source=sql.Identifier(source),
            )

        return sql.SQL(
            "outboxed AS (INSERT INTO {outbox} ({columns}) {upserts} UNION ALL {deletes} RETURNING 1)"
        ).format(
            outbox=self.names.outbox,
            columns=_list([sql.Identifier(c) for c in tables.OUTBOX_COLUMNS]),
            upserts=select("upserted", utf8(box.value)),
            deletes=select("deleted", sql.SQL("NULL::bytea")),
        )

    def _finish(self, dead_letters: bool = True) -> list[sql.Composable]:
        """dead_letters: False where no staged row is a dead letter: `dead` is then empty."""
        n = self.names
        dead = sql.SQL(
            "dead AS (INSERT INTO {dead} (sink, topic, kafka_partition, kafka_offset, key, value, error)"
            " SELECT %(sink)s, _topic, _partition, _offset, _raw_key, _raw_value, _error FROM fresh"
            " WHERE _error IS NOT NULL RETURNING 1)"
            if dead_letters
            else "dead AS (SELECT 1 WHERE false)"
        ).format(dead=n.dead)
        if self.lane is not None:
            return [dead]
        progress = sql.SQL("progress AS ({} RETURNING 1)").format(
            self._advance(sql.SQL("SELECT %(sink)s, _topic, _partition, next_offset FROM staged"))
        )
        return [dead, progress]

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
