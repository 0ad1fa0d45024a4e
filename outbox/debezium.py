"""Debezium's outbox layout, adopted: a trigger that does what its EventRouter does.

Applications written for Debezium insert into their own outbox table
(`id, aggregatetype, aggregateid, type, payload`), often deleting the row in
the same transaction, since Debezium reads the WAL. `install` puts an AFTER
INSERT trigger on that table which copies each row into `outbox_events`, in
the same transaction, mapped as the EventRouter maps it: the relay then
publishes what Debezium would, and the application changes nothing. A row
deleted in its own transaction has been copied already.

The mapping is the router's, with its documented defaults (Debezium 3.6):
topic `outbox.event.<aggregatetype>`, key `aggregateid`, value `payload`, the
row's `id` as header `id` (the relay's `--event-id-header id`), and
`table.fields.additional.placement` for more headers. Keys and values are
written as Connect's StringConverter writes them (a bytea column's bytes as
they are), headers as its SimpleHeaderConverter does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from outbox.core import tables
from outbox.errors import error
from outbox.migrations import LOCK_TIMEOUT, lock_timeout_setting

__all__ = ["ID_HEADER", "ROUTER_DEFAULTS", "Router", "adopters", "install", "installed", "uninstall"]

ID_HEADER = "id"  # the header the EventRouter puts the row's id in
ROUTER_DEFAULTS: Mapping[str, str] = {
    "table.field.event.id": "id",
    "table.field.event.key": "aggregateid",
    "table.field.event.payload": "payload",
    "route.by.field": "aggregatetype",
    "route.topic.replacement": "outbox.event.${routedByValue}",
    "table.fields.additional.placement": "",
}
ROUTED = "${routedByValue}"
TRIGGER = "outbox_adopt_debezium"
# Types whose text is what Connect's converters write for them (a timestamp would be a number there).
_PLAIN_TYPES = frozenset(
    {"text", "character varying", "character", "uuid", "smallint", "integer", "bigint", "boolean"}
)


@dataclass(frozen=True)
class Router:
    """Which column is what, as the EventRouter's options say."""

    event_id: str
    key: str
    payload: str
    route_by: str
    topic: str  # route.topic.replacement: ROUTED stands for the route_by column's value
    headers: tuple[tuple[str, str], ...] = ()  # (column, header name), in the order given

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Router:
        """The router from Debezium's option names, with or without their `transforms.NAME.` prefix."""
        given = {_bare(k): v for k, v in options.items()}
        unknown = sorted(set(given) - set(ROUTER_DEFAULTS) - {"type"})
        if unknown:
            raise error("ADOPT_OPTION_UNSUPPORTED", option=unknown[0], supported=", ".join(ROUTER_DEFAULTS))
        o = {**ROUTER_DEFAULTS, **given}
        return cls(
            event_id=o["table.field.event.id"],
            key=o["table.field.event.key"],
            payload=o["table.field.event.payload"],
            route_by=o["route.by.field"],
            topic=o["route.topic.replacement"],
            headers=_placements(o["table.fields.additional.placement"]),
        )

    def columns(self) -> dict[str, str]:
        """Each column the router reads, with the option that names it."""
        named = {
            self.event_id: "table.field.event.id",
            self.key: "table.field.event.key",
            self.payload: "table.field.event.payload",
        }
        if ROUTED in self.topic:
            named[self.route_by] = "route.by.field"
        return named | {column: "table.fields.additional.placement" for column, _ in self.headers}

    def describe(self) -> str:
        topic = self.topic.replace(ROUTED, f"<{self.route_by}>")
        headers = ", ".join([f"{ID_HEADER} <- {self.event_id}", *(f"{h} <- {c}" for c, h in self.headers)])
        return f"topic {topic}, key {self.key}, value {self.payload}, headers {headers}"


def _bare(option: str) -> str:
    parts = option.split(".")
    return ".".join(parts[2:]) if parts[0] == "transforms" and len(parts) > 2 else option


def _placements(text: str) -> tuple[tuple[str, str], ...]:
    """`table.fields.additional.placement`: COLUMN:PLACEMENT[:ALIAS], comma separated."""
    found = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        column, _, rest = item.partition(":")
        placement, _, alias = rest.partition(":")
        if not column or placement != "header":
            raise error("ADOPT_PLACEMENT_UNSUPPORTED", item=item)
        found.append((column, alias or column))
    return tuple(found)


def _function(schema: str, table: str) -> sql.Identifier:
    """The trigger's function: named for the table, short enough for any table name."""
    digest = hashlib.sha256(f"{schema}.{table}".encode()).hexdigest()[:12]
    return sql.Identifier(schema, f"{TRIGGER}_{digest}")


def _types(conn: psycopg.Connection[Any], schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0"
        " AND NOT a.attisdropped",
        [schema, table],
    ).fetchall()
    return dict(rows)


def _checked(router: Router, types: Mapping[str, str], name: str) -> None:
    for column, option in router.columns().items():
        kind = types.get(column)
        if kind is None:
            raise error("ADOPT_COLUMN_MISSING", table=name, column=column, option=option)
        if column == router.event_id and kind != "uuid":
            raise error(
                "ADOPT_COLUMN_TYPE", table=name, column=column, type=kind, needs="uuid, the event's id"
            )
        if option in ("route.by.field", "table.fields.additional.placement") and kind not in _PLAIN_TYPES:
            raise error(
                "ADOPT_COLUMN_TYPE",
                table=name,
                column=column,
                type=kind,
                needs="text, a uuid, an integer or a boolean",
            )


def _bytes(column: str, kind: str) -> sql.Composable:
    """A column as the bytes Connect's StringConverter writes: its text in UTF-8; bytea as it is."""
    value = sql.SQL("NEW.{}").format(sql.Identifier(column))
    if kind == "bytea":
        return value
    return sql.SQL("convert_to({}::text, 'UTF8')").format(value)


def _topic(router: Router) -> sql.Composable:
    """The topic, `${routedByValue}` replaced by the column's text. Where that is NULL the
    placeholder stays: no name Kafka takes, so the relay stops at the row and names it, where
    Debezium's router would fail its task."""
    parts = router.topic.split(ROUTED)
    if len(parts) == 1:
        return sql.Literal(router.topic)
    routed = sql.SQL("coalesce(NEW.{}::text, {})").format(
        sql.Identifier(router.route_by), sql.Literal(ROUTED)
    )
    return sql.SQL(" || ").join(
        [piece for i, part in enumerate(parts) for piece in ([routed] if i else []) + [sql.Literal(part)]]
    )


def body(router: Router, types: Mapping[str, str], outbox_schema: str) -> sql.Composed:
    """The trigger function's PL/pgSQL: one row into outbox_events per row inserted."""
    headers: tuple[sql.Composable, sql.Composable] = (sql.SQL("NULL"), sql.SQL("NULL"))
    if router.headers:
        headers = (
            sql.SQL("ARRAY[{}]::text[]").format(
                sql.SQL(", ").join(sql.Literal(h) for _, h in router.headers)
            ),
            sql.SQL("ARRAY[{}]::bytea[]").format(
                sql.SQL(", ").join(_bytes(c, types[c]) for c, _ in router.headers)
            ),
        )
    return sql.SQL(
        "BEGIN INSERT INTO {events} (event_id, topic, key, value, header_keys, header_values)"
        " VALUES (NEW.{id}, {topic}, {key}, {value}, {names}, {values}); RETURN NULL; END"
    ).format(
        events=sql.Identifier(outbox_schema, tables.OUTBOX_EVENTS),
        id=sql.Identifier(router.event_id),
        topic=_topic(router),
        key=_bytes(router.key, types[router.key]),
        value=_bytes(router.payload, types[router.payload]),
        names=headers[0],
        values=headers[1],
    )


def install(
    conn: psycopg.Connection[Any],
    schema: str,
    table: str,
    outbox_schema: str,
    router: Router,
    lock_timeout: float = LOCK_TIMEOUT,
) -> None:
    """Put (or put again, with another mapping) the trigger on schema.table, in one transaction
    that waits `lock_timeout` seconds at most for the table (psycopg's LockNotAvailable then).

    The function runs as its owner (SECURITY DEFINER, a fixed search_path), so the application's
    role needs no grant on outbox_events; and no other role may execute it (a trigger of its own
    on a table of its own would write into outbox_events): firing a trigger checks no grant."""
    name = f"{schema}.{table}"
    types = _types(conn, schema, table)
    if not types:
        raise error("ADOPT_TABLE_MISSING", table=name)
    _checked(router, types, name)
    function = _function(schema, table)
    code = body(router, types, outbox_schema).as_string(conn)
    with conn.transaction():
        _wait_at_most(conn, lock_timeout)
        conn.execute(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER"
                " SET search_path = pg_catalog, pg_temp AS {}"
            ).format(function, sql.Literal(code))
        )
        conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {}() FROM PUBLIC").format(function))
        conn.execute(
            sql.SQL("COMMENT ON FUNCTION {}() IS {}").format(
                function, sql.Literal(f"outbox db adopt-debezium: {name} -> {router.describe()}")
            )
        )
        conn.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(TRIGGER), sql.Identifier(schema, table)
            )
        )
        conn.execute(
            sql.SQL("CREATE TRIGGER {} AFTER INSERT ON {} FOR EACH ROW EXECUTE FUNCTION {}()").format(
                sql.Identifier(TRIGGER), sql.Identifier(schema, table), function
            )
        )


def uninstall(
    conn: psycopg.Connection[Any], schema: str, table: str, lock_timeout: float = LOCK_TIMEOUT
) -> bool:
    """Take the trigger and its function away; False when there was none."""
    if not _types(conn, schema, table):
        raise error("ADOPT_TABLE_MISSING", table=f"{schema}.{table}")
    with conn.transaction():
        _wait_at_most(conn, lock_timeout)
        had = installed(conn, schema, table)
        conn.execute(
            sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                sql.Identifier(TRIGGER), sql.Identifier(schema, table)
            )
        )
        conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}()").format(_function(schema, table)))
    return had


def _wait_at_most(conn: psycopg.Connection[Any], seconds: float) -> None:
    """This transaction's statements wait `seconds` at most for a lock: a trigger's DDL queued
    behind another transaction on the table would hold up every insert into it meanwhile."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", [lock_timeout_setting(seconds)])


def installed(conn: psycopg.Connection[Any], schema: str, table: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND t.tgname = %s",
        [schema, table, TRIGGER],
    ).fetchone()
    return row is not None


def adopters(outbox_schema: str) -> sql.Composed:
    """A query of the tables whose adopt trigger copies rows into outbox_schema's outbox_events
    (schema, name): dropping that table would fail each of their applications' inserts."""
    target = sql.Identifier(outbox_schema, tables.OUTBOX_EVENTS)
    return sql.SQL(
        "SELECT n.nspname, c.relname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE t.tgname = {} AND position({} in p.prosrc) > 0 ORDER BY 1, 2"
    ).format(sql.Literal(TRIGGER), sql.Literal(target.as_string(None)))
