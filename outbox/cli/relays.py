"""`outbox relays list | rebase | forget`: the relays of an outbox as its database records them."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from outbox.cli import options
from outbox.core import tables
from outbox.core.config import database_url, schema_name
from outbox.core.postgres import connect, reason
from outbox.errors import error
from outbox.relay import registry
from outbox.relay.position import Shard


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    relays = commands.add_parser("relays", help="list, rebase or forget the relays of an outbox")
    actions = relays.add_subparsers(dest="action", required=True, metavar="ACTION")

    options.database(
        actions.add_parser("list", help="each relay shard: position base, mark, running or not")
    ).set_defaults(handler=cmd_list)
    rebase = options.database(
        actions.add_parser(
            "rebase",
            help="after a restore into another cluster: every relay publishes every row left again",
            description="Stamp every row left in the outbox anew, so that every relay of it publishes"
            " them again (consumers drop duplicates by event id). For a database restored into another"
            " cluster (pg_dump, pg_upgrade), which relays refuse. Stop every relay of the outbox first.",
        )
    )
    rebase.add_argument(
        "--relay",
        action="append",
        default=[],
        metavar="NAME[:I/N]",
        help="also a relay the database has no record of (shard I of N; default 0/1); repeatable",
    )
    rebase.set_defaults(handler=cmd_rebase)
    forget = options.database(
        actions.add_parser("forget", help="drop a retired relay, so cleanup stops waiting for it")
    )
    forget.add_argument("name")
    forget.set_defaults(handler=cmd_forget)


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """A connection to the outbox's database and its schema; a database error as one line."""
    url, schema = database_url(args.url), schema_name(args.schema)
    with connect(url, autocommit=True) as conn:
        tables.require(conn, url, schema, (tables.OUTBOX_EVENTS, tables.RELAY_POSITIONS))
        try:
            yield conn, schema
        except psycopg.Error as exc:
            raise error(
                "RELAY_REGISTRY_DATABASE_ERROR", action=args.action, url=url.safe, reason=reason(exc, url)
            ) from None


def cmd_list(args: argparse.Namespace) -> int:
    with _database(args) as (conn, schema):
        found = registry.registered(conn, schema)
    if not found:
        print(f"# no relay has published the outbox in schema {schema!r} yet")
    for r in found:
        state = "running" if r.running else "stopped"
        at = f"{r.updated_at:%Y-%m-%d %H:%M:%S%z}"
        print(f"{r.relay}\tshard {r.shard}\t{state}\tmark {r.mark}\tbase {r.base}\tat {at}")
    return 0


def cmd_rebase(args: argparse.Namespace) -> int:
    extra = []
    for given in args.relay:
        name, _, shard = given.rpartition(":") if ":" in given else (given, "", "0/1")
        extra.append((name, Shard.parse(shard)))
    with _database(args) as (conn, schema):
        stamped, shards = registry.rebase(conn, schema, extra)
    print(f"# {stamped} outbox rows will be published again by {shards} relay shard(s) of schema {schema!r}")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    with _database(args) as (conn, schema):
        dropped = registry.forget(conn, schema, args.name)
    print(f"# forgot relay {args.name!r} ({dropped} shard(s)); cleanup no longer waits for it")
    return 0
