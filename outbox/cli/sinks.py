"""`outbox sinks adopt`: record a checkpoint moved onto a sink as the sink's own.

Each batch a sink applies records (query, batch id) in PostgreSQL, and the
next batch of that query checks the record is still there
(sinks/postgres/continuity.py). A query past its first batch with no record
has lost them to a restore, or its checkpoint was never this sink's: moved
onto it, or the sink added to a running query. Only the user can tell which;
this says the second.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import psycopg
from psycopg import sql

from outbox.cli import options
from outbox.core import tables
from outbox.core.config import database_url, schema_name
from outbox.core.postgres import connect, reason
from outbox.errors import error


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sinks = commands.add_parser("sinks", help="what PostgreSQL records of the sinks' queries")
    actions = sinks.add_subparsers(dest="action", required=True, metavar="ACTION")
    adopt = options.database(
        actions.add_parser(
            "adopt",
            help="record a checkpoint moved onto a sink as the sink's own",
            description="Record a Spark query's last committed batch as applied by SINK, so that its next"
            " batch is not refused as lost (SINK_BATCH_LOST): for a checkpoint that was never the sink's,"
            " moved onto it or the sink added to a running query. Not after a restore: there the batches"
            " are lost, and the error names how to read them again.",
        )
    )
    adopt.add_argument(
        "sink", help="the sink's name (PostgresSink's name=, by default its table, schema.table)"
    )
    adopt.add_argument("--checkpoint", type=Path, help="the query's checkpoint folder, on this machine")
    adopt.add_argument("--query", help="the query's id (the `id` in its checkpoint's metadata file)")
    adopt.add_argument("--batch", type=int, help="its last committed batch (the highest number in commits/)")
    adopt.set_defaults(handler=cmd_adopt)


def checkpointed(folder: Path) -> tuple[str, int | None]:
    """A local checkpoint's query id and last committed batch (None: none committed yet)."""
    try:
        query = str(json.loads((folder / "metadata").read_text().splitlines()[0])["id"])
        commits = folder / "commits"
        done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise error(
            "SINKS_CHECKPOINT_UNREADABLE", path=str(folder), reason=str(exc) or type(exc).__name__
        ) from None
    return query, max(done, default=None)


def cmd_adopt(args: argparse.Namespace) -> int:
    if args.checkpoint is not None and args.query is None and args.batch is None:
        query, batch = checkpointed(args.checkpoint)
    elif args.checkpoint is None and args.query and args.batch is not None and args.batch >= 0:
        query, batch = args.query, args.batch
    else:
        raise error("SINKS_ADOPT_ARGUMENTS")
    if batch is None:
        print(f"# query {query} has committed no batch yet: its first one needs no record")
        return 0
    url, schema = database_url(args.url), schema_name(args.schema)
    with connect(url, autocommit=True) as conn:
        tables.require(conn, url, schema, (tables.SINK_BATCHES,))
        try:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (sink, query_id, batch_id) VALUES (%s, %s, %s)"
                    " ON CONFLICT (sink, query_id) DO NOTHING RETURNING batch_id"
                ).format(sql.Identifier(schema, tables.SINK_BATCHES)),
                [args.sink, query, batch],
            ).fetchone()
            held = (
                None
                if row
                else conn.execute(
                    sql.SQL("SELECT batch_id FROM {} WHERE sink = %s AND query_id = %s").format(
                        sql.Identifier(schema, tables.SINK_BATCHES)
                    ),
                    [args.sink, query],
                ).fetchone()
            )
        except psycopg.Error as exc:
            raise error(
                "SINKS_DATABASE_ERROR", action="adopt", url=url.safe, reason=reason(exc, url)
            ) from None
    if held is not None:
        print(f"# sink {args.sink} already holds query {query}, at batch {held[0]}: nothing changed")
    else:
        print(f"# sink {args.sink} now holds query {query} at batch {batch}: its batch {batch + 1} goes on")
    return 0
