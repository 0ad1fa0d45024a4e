"""The SQL that applies a batch, built with psycopg.sql so every name is quoted; the stage table's,
the batch record's and the ledger's are bookkeeping.py's, which `Statements` builds on.

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

from psycopg import sql

from outbox.core import tables
from outbox.core.sqltext import Query, bindable, user_sql
from outbox.core.trace import key_text_sql, outbox_event_id_sql
from sinks.postgres.bookkeeping import ATTEMPT_SETTING, META, Bookkeeping, Names, listed

# Names, ATTEMPT_SETTING and META are bookkeeping.py's, and imported from here as before.
__all__ = ["ATTEMPT_SETTING", "META", "Names", "Statements"]

_WHOLE_BATCH = sql.SQL("0")  # the round of a batch applied in one statement


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


class Statements(Bookkeeping):
    """Every statement of one sink, from its spec and plan."""

    def past_ledger(self) -> Statements:
        """These statements for a task's stage whose every row is past the ledger, as the task found
        holding its ledger rows' locks (task.py): the stage is read as it is, not joined to the
        ledger row by row, which cost a fifth of the applying statement."""
        assert self.in_task, "a shared stage holds other attempts' rows"
        lean = copy.copy(self)
        lean.unapplied = True
        return lean

    # -- applying ----------------------------------------------------------------------------------------

    def rounds(self) -> Query:
        """How many events the busiest key has in this batch: 1 (or 0) means one statement applies it."""
        keys = listed(self.keys)
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
            ).format(listed(self.keys)),
            1,
            _LATEST_OF_FRESH,
        )
        return self._with(ctes, [*counts, sql.SQL("1") if deletes else most])

    def materialize_rounds(self) -> Query:
        """The rows to apply, in a temp table: _round is the event's place among its key's events,
        _n its place in the round."""
        keys = listed(self.keys)
        return bindable(
            sql.SQL(
                "CREATE TEMP TABLE {rounds} ON COMMIT DROP AS WITH {ctes}"
                " SELECT row_number() OVER (PARTITION BY _round ORDER BY {keys}) AS _n, * FROM"
                " (SELECT row_number() OVER (PARTITION BY {keys} ORDER BY _topic, _partition, _offset)"
                " AS _round, * FROM fresh WHERE _error IS NULL) AS r"
            ).format(rounds=self.names.rounds, ctes=listed([self._staged(), self._fresh()]), keys=keys)
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
        pairs = listed(
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
        return bindable(sql.SQL("WITH {} SELECT {}").format(listed(ctes), listed(selects)))

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
            returning = listed([sql.SQL("t.{}").format(k) for k in self.target_keys])
        else:
            returning = sql.SQL("1")
        deleted = sql.SQL(
            "deleted AS (DELETE FROM {target} AS t USING latest AS l"
            " WHERE l._delete AND {match}{newer} RETURNING {returning})"
            if deletes
            else "deleted AS (SELECT {returning} FROM {target} AS t WHERE false)"
        ).format(target=n.target, match=match, newer=newer, returning=returning)
        upserted = sql.SQL(
            "upserted AS (INSERT INTO {target} AS t ({columns}) SELECT {staged} FROM latest WHERE NOT _delete"
            " ON CONFLICT ({keys}) {conflict} RETURNING {returning})"
        ).format(
            target=n.target,
            columns=listed(self.targets),
            staged=listed(self.staged),
            keys=listed(self.target_keys),
            conflict=self._conflict(),
            returning=returning,
        )
        return [
            deleted,
            upserted,
            *([self._outbox(round_)] if self.spec.outbox else []),
            *([self._traced(round_)] if self.spec.trace else []),
        ]

    def _conflict(self) -> sql.Composable:
        """What an upsert does to the row of its key: nothing on "insert", else an update that a
        redelivered event or an older version does not make."""
        changed = [c for c in self.columns if c not in self.spec.key]
        if self.spec.mode == "insert" or not changed:
            return sql.SQL("DO NOTHING")
        updates = [sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in changed]

        # A redelivered event leaves the row (and the outbox) untouched; an older version too.
        def side(alias: str) -> sql.Composed:
            return listed(
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
        return sql.SQL("DO UPDATE SET {} WHERE {}").format(listed(updates), guard)

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
            " events, versions, written, deletes, removed, target)"
            " SELECT %(sink)s, pg_current_xact_id(), {round}, {outbox_topic}, array_agg(l._topic),"
            " array_agg(l._partition), array_agg(l._offset), array_agg({event}), {version},"
            " CASE WHEN (SELECT count(*) FROM upserted) < count(*) FILTER (WHERE NOT l._delete)"
            " THEN {written} END,"
            " coalesce(array_agg({event}) FILTER (WHERE l._delete), '{{}}'), {removed}, {target}"
            " FROM latest AS l HAVING count(*) > 0 RETURNING 1)"
        ).format(
            traces=self.names.traces,
            round=round_,
            outbox_topic=sql.Literal(box.topic if box else None),
            event=self._event("l", self.keys),
            version=version,
            written=events_of("upserted"),
            removed=events_of("deleted"),
            target=sql.Literal(self._target),
        )

    @property
    def _target(self) -> str:
        """The table as a trace names it (outbox/core/trace.py): a routed sink's lanes share the rest."""
        return f"{self.spec.schema}.{self.spec.table}"

    def _outbox(self, round_: sql.Composable) -> sql.Composable:
        box = self.spec.outbox
        assert box is not None

        def utf8(expr: str | None) -> sql.Composable:
            if not expr:
                return sql.SQL("NULL::bytea")
            return sql.SQL("convert_to(({})::text, 'UTF8')").format(user_sql(expr))

        names = sql.Literal(list(box.headers))
        values = sql.SQL("ARRAY[{}]::bytea[]").format(listed([utf8(e) for e in box.headers.values()]))
        # Traced, an event's id is derived (outbox/core/trace.py): a trace computes it from what it read.
        event_id = (
            outbox_event_id_sql(
                key_text_sql(sql.Identifier("written"), self.target_keys), round_, self._target
            )
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
            columns=listed([sql.Identifier(c) for c in tables.OUTBOX_COLUMNS]),
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
