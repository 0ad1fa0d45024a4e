"""The SQL the relay runs on its outbox's tables, built with psycopg.sql so every name is quoted.

A relay shard's statements are composed once, when its OutboxTable is made
(`Statements`), since a batch's read runs at every batch. outbox_table.py runs
them; a statement that names none of the outbox's tables stays there, beside
the call that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from outbox.core import tables
from outbox.core.sqltext import bindable
from outbox.relay.position import Shard

__all__ = ["CHANNEL", "KEY_HASH", "SIZE", "Names", "Statements"]

# Set by migration 0002's trigger at each committing insert.
CHANNEL = "outbox_events"

# What a batch's byte budget counts of a row: its key and value.
SIZE = sql.SQL("(coalesce(octet_length(e.key), 0) + coalesce(octet_length(e.value), 0))")


# md5 is stable across server versions (hashtext is not promised to be): a row's
# shard is the first 32 bits of md5(key, or the event id when there is no key) mod N.
KEY_HASH = "('x00000000' || left(md5(coalesce(e.key, uuid_send(e.event_id))), 8))::bit(64)::bigint"


def _shard_filter(shard: Shard) -> sql.Composable:
    if shard.count == 1:
        return sql.SQL("")
    return sql.SQL(" AND mod({hash}, {count}) = {index}").format(
        hash=sql.SQL(KEY_HASH), count=sql.Literal(shard.count), index=sql.Literal(shard.index)
    )


@dataclass(frozen=True)
class Names:
    """Quoted names for one relay shard, and its filter on an outbox row `e`."""

    events: sql.Identifier
    dead: sql.Identifier
    positions: sql.Identifier
    identity: sql.Identifier
    shard: sql.Composable  # empty for a relay of one shard
    hash: sql.Composable  # KEY_HASH, a row's hash for its shard

    @classmethod
    def of(cls, schema: str, shard: Shard) -> Names:
        return cls(
            events=sql.Identifier(schema, tables.OUTBOX_EVENTS),
            dead=sql.Identifier(schema, tables.RELAY_DEAD_LETTERS),
            positions=sql.Identifier(schema, tables.RELAY_POSITIONS),
            identity=sql.Identifier(schema, tables.OUTBOX_IDENTITY),
            shard=_shard_filter(shard),
            hash=sql.SQL(KEY_HASH),
        )


class Statements:
    """Every statement of one relay shard that names the outbox's tables, composed once."""

    def __init__(self, schema: str, shard: Shard) -> None:
        n = self.names = Names.of(schema, shard)
        self.outbox_id = sql.SQL("SELECT id::text FROM {}").format(n.identity)
        self.listen = sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL))
        self.begin = {fresh: _begin(n, fresh=fresh) for fresh in (True, False)}
        self.start_delta, self.continue_delta = _deltas(n)
        self.cleanup = _cleanup(n)
        self.mark = _mark(n)
        self.record_base = _record_base(n)
        self.read_layouts = bindable(
            sql.SQL(
                "SELECT DISTINCT shards FROM {positions} WHERE relay = %s AND shards <> %s ORDER BY 1"
            ).format(positions=n.positions)
        )
        self.read_mark = bindable(
            sql.SQL(
                "SELECT base, target, mark, system_identifier FROM {positions}"
                " WHERE relay = %s AND shard = %s AND shards = %s"
            ).format(positions=n.positions)
        )
        self.dead_letter = _dead_letter(n)


def _begin(n: Names, *, fresh: bool) -> sql.Composed:
    """A read's first statement; fresh: the read takes a new snapshot, and may write its mark.

    A table rewrite (ALTER TABLE with a volatile default or a new type;
    pg_repack's copy) gives every row its own transaction id, so a snapshot
    taken while one waits to commit sees the table empty (PostgreSQL's caveat
    for rewrites): the delta looked empty and was gone past. The lock comes
    before the snapshot, which REPEATABLE READ takes at the first query, so the
    snapshot sees any rewrite that held the table.
    """
    return sql.SQL(
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, {mode};"
        " LOCK TABLE {events}, {dead} IN ACCESS SHARE MODE"
    ).format(mode=sql.SQL("READ WRITE" if fresh else "READ ONLY"), events=n.events, dead=n.dead)


def _deltas(n: Names) -> tuple[sql.Composed, sql.Composed]:
    """The two ways into a delta: starting one, and continuing one (a backlog published in parts).

    Starting one goes through the txid index, since the delta is the
    transactions at or past the base's xmax plus those it saw running.
    Continuing one goes along the primary key from the last id published,
    stopping after `limit` rows, so each part costs its own size and not the
    size of what is left.
    """
    # Decoding dominates a read, so columns come ready to send: empty header
    # arrays as NULL (nothing to decode) and date_part's float8, not extract's numeric.
    row = sql.SQL(
        "SELECT e.id, convert_to(e.event_id::text, 'UTF8') AS event_id, e.topic, e.key, e.value,"
        " nullif(e.header_keys, '{{}}') AS header_keys, nullif(e.header_values, '{{}}') AS header_values,"
        " date_part('epoch', e.created_at) AS created_at, {size} AS size FROM {events} e"
    ).format(size=SIZE, events=n.events)
    wanted = sql.SQL(
        " AND pg_visible_in_snapshot(e.txid, %(target)s::pg_snapshot)"
        " AND e.id > %(after)s{shard}"
        " AND NOT EXISTS (SELECT FROM {dead} d WHERE d.relay = %(relay)s AND d.outbox_id = e.id"
        " AND d.event_id = e.event_id)"
        " ORDER BY e.id LIMIT %(limit)s"
    ).format(shard=n.shard, dead=n.dead)
    # Up to `limit` rows, ending with the first that brings their keys and values to `budget`
    # bytes: a batch holds at most the budget and one row. Sizes come from the rows' headers,
    # values untouched, so a large row after the cut is never read. (After an outage, 5,000
    # rows can be gigabytes.)
    # The last column, the bytes up to each row, tells the reader whether the budget cut the read.
    # Summed over the `limit` rows, not under them: the LIMIT stays a bounded top-N read.
    budgeted = sql.SQL(
        "SELECT id, event_id, topic, key, value, header_keys, header_values, created_at, upto FROM"
        " (SELECT r.*, sum(r.size) OVER (ORDER BY r.id ROWS UNBOUNDED PRECEDING) AS upto"
        " FROM ({rows}) r) w WHERE w.upto - w.size < %(budget)s ORDER BY w.id"
    )
    start = bindable(
        budgeted.format(
            rows=sql.SQL(
                "{row} WHERE (e.txid >= pg_snapshot_xmax(%(base)s::pg_snapshot)"
                " OR e.txid = ANY(ARRAY(SELECT pg_snapshot_xip(%(base)s::pg_snapshot)))){wanted}"
            ).format(row=row, wanted=wanted)
        )
    )
    continuing = bindable(
        budgeted.format(
            rows=sql.SQL(
                "{row} WHERE NOT pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){wanted}"
            ).format(row=row, wanted=wanted)
        )
    )
    return start, continuing


def _cleanup(n: Names) -> sql.Composed:
    """Rows published by this relay, and by every other relay of the outbox too, as far as the
    base of its last mark says: a slower relay's rows are never deleted under it."""
    return bindable(
        sql.SQL(
            "DELETE FROM {events} WHERE id IN (SELECT e.id FROM {events} e"
            " WHERE e.txid < pg_snapshot_xmax(%(base)s::pg_snapshot)"
            " AND pg_visible_in_snapshot(e.txid, %(base)s::pg_snapshot){shard}"
            " AND e.created_at < now() - make_interval(secs => %(retention)s)"
            " AND NOT EXISTS (SELECT FROM {positions} o WHERE o.relay <> %(relay)s"
            "  AND NOT EXISTS (SELECT FROM {positions} m WHERE m.relay = o.relay AND m.shards = o.shards"
            "   AND mod({hash}, m.shards) = m.shard"
            "   AND pg_visible_in_snapshot(e.txid, m.base::pg_snapshot)))"
            " ORDER BY e.id LIMIT %(limit)s)"
        ).format(events=n.events, shard=n.shard, positions=n.positions, hash=n.hash)
    )


def _mark(n: Names) -> sql.Composed:
    """Written in the transaction that takes a delta's snapshot, committed synchronously before
    any of the delta goes to Kafka: see resume.py."""
    return bindable(
        sql.SQL(
            "INSERT INTO {positions} AS p (relay, shard, shards, base, target, mark, system_identifier)"
            " VALUES (%(relay)s, %(index)s, %(count)s, %(base)s, %(target)s, %(floor)s + 1, %(system)s)"
            " ON CONFLICT (relay, shard, shards) DO UPDATE SET base = excluded.base,"
            " target = excluded.target, mark = greatest(p.mark, %(floor)s) + 1,"
            " system_identifier = excluded.system_identifier, updated_at = now()"
            " RETURNING mark"
        ).format(positions=n.positions)
    )


def _record_base(n: Names) -> sql.Composed:
    """A relay's base moves on without a mark while deltas are empty; other relays' cleanup needs
    to see it move (and a rewind may start from it: it is published)."""
    return bindable(
        sql.SQL(
            "UPDATE {positions} SET base = %(base)s, updated_at = now()"
            " WHERE relay = %(relay)s AND shard = %(index)s AND shards = %(count)s"
            " AND pg_snapshot_xmax(base::pg_snapshot) < pg_snapshot_xmax(%(base)s::pg_snapshot)"
        ).format(positions=n.positions)
    )


def _dead_letter(n: Names) -> sql.Composed:
    return bindable(
        sql.SQL(
            "INSERT INTO {dead} (relay, outbox_id, event_id, topic, key, value, header_keys,"
            " header_values, created_at, error)"
            " SELECT %(relay)s, id, event_id, topic, key, value, header_keys, header_values, created_at,"
            " %(error)s FROM {events} WHERE id = %(id)s ON CONFLICT DO NOTHING"
        ).format(dead=n.dead, events=n.events)
    )
