"""What a tracing sink writes and `outbox trace` reads back: the one rule both halves share.

An event is found by its key as text: the key column, in the table's type, as
text; a key of several columns is those texts as one line of CSV (joined with
',', a text holding ',', '"' or a line break quoted), so no two keys share an
event, nor the id of an outbox event. The outbox event a tracing sink writes for a row
takes an id derived from the sink, the transaction, the round, the table and
that key text: unique (a key is written once per round of a transaction in a
table; a routed sink's tables share the rest), and what a trace that found the
key's record computes again, with no link stored.
"""

from __future__ import annotations

import hashlib
import uuid

from psycopg import sql


def outbox_event_id(sink: str, txid: str, round_: int, key_text: str, target: str | None) -> uuid.UUID:
    """The id of the outbox event a tracing sink wrote for the row of `key_text` in table `target`
    (schema.table; None for a trace row of before migration 0015, which had none): md5 as a uuid."""
    parts = [sink, txid, str(round_), *([target] if target is not None else []), key_text]
    return uuid.UUID(hashlib.md5("\n".join(parts).encode()).hexdigest())


def key_text_sql(alias: sql.Composable, columns: list[sql.Identifier]) -> sql.Composable:
    """A row's key as text: its key column's text, or its key columns' texts as one line of CSV."""
    texts = [sql.SQL("{}.{}::text").format(alias, c) for c in columns]
    if len(texts) == 1:
        return texts[0]
    quoted = [
        sql.SQL(
            """CASE WHEN {0} ~ E'[,"\\r\\n]' THEN '"' || replace({0}, '"', '""') || '"' ELSE {0} END"""
        ).format(t)
        for t in texts
    ]
    return sql.SQL("concat_ws(',', {})").format(sql.SQL(", ").join(quoted))


def outbox_event_id_sql(key_text: sql.Composable, round_: sql.Composable, target: str) -> sql.Composable:
    """outbox_event_id in the applying statement (its %(sink)s parameter, its transaction)."""
    return sql.SQL(
        "md5(concat_ws(E'\\n', %(sink)s::text, pg_current_xact_id()::text, ({})::text, {}, {}))::uuid"
    ).format(round_, sql.Literal(target), key_text)
