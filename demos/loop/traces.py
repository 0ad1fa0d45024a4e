"""The demo's last word: `outbox trace` of an event the Spark job was killed with, and of the poison one.

Which event was in flight is decided from what the run recorded: of those
committed to Kafka before a kill -9 of the Spark job that the sink's traces
say it applied after the restart, the one committed closest to its kill. A
job that had caught up when it was killed had nothing in flight: then the
first event its restart applied is traced, and said to be that. The command
is run as a user runs it, and its JSON checked: the event applied once and
published, the poison one dead-lettered and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from outbox.core import tables
from outbox.trace.report import Position

TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Pick:
    """An event to trace: why, its key (the account) and its input record."""

    why: str
    account: int
    at: Position
    dead_lettered: bool = False  # what the trace must show: dead-lettered, or applied and published


@dataclass(frozen=True)
class Traced:
    pick: Pick
    command: str  # as a user types it
    output: str  # the command's lines
    ok: bool
    problem: str = ""


def in_flight(
    conn: psycopg.Connection[Any],
    schema: str,
    topic: str,
    kills: Sequence[float],
    committed_at: Mapping[str, float],
    events: Mapping[str, dict],
    at: Mapping[str, tuple[int, int]],
) -> Pick | None:
    """The event to trace for the Spark job's kills (wall times); None with no event."""
    by_place = {place: event for event, place in at.items() if event in committed_at and event in events}
    applied = {kill: _applied_after(conn, schema, topic, kill) for kill in kills}
    choice = choose(kills, committed_at, by_place, applied)
    return _pick(choice[0], choice[1], topic, events, at) if choice else None


def choose(
    kills: Sequence[float],
    committed_at: Mapping[str, float],
    by_place: Mapping[tuple[int, int], str],
    applied: Mapping[float, Sequence[tuple[float, int, int]]],
) -> tuple[str, str] | None:
    """(why, event): of the events committed before a kill and applied after it, the one committed
    closest to its kill. If there is none (the job had caught up each time), the first event applied
    after the latest kill that was followed by any; if no kill was (the job is also killed once it
    has applied everything), the event committed last. `applied`: per kill, (when, partition,
    offset) of what the sink's traces say was applied after it. None only with no event."""
    flights = [
        (kill - committed_at[event], kill, event)
        for kill in kills
        for _, partition, offset in applied[kill]
        if (event := by_place.get((partition, offset))) is not None and committed_at[event] < kill
    ]
    if flights:
        ahead, kill, event = min(flights)
        return (
            f"an event in flight: committed to Kafka {_span(ahead)} before a kill -9 of the Spark job"
            f" (at {_clock(kill)}), applied after its restart",
            event,
        )
    for kill in reversed(kills):
        after = sorted((when, (p, o)) for when, p, o in applied[kill] if (p, o) in by_place)
        if after:
            return (
                "nothing was in flight at the kills -9 of the Spark job (it had caught up each time):"
                f" the first event its restart after the kill at {_clock(kill)} applied",
                by_place[after[0][1]],
            )
    last = max(by_place.values(), key=committed_at.__getitem__, default=None)
    if last is None:
        return None
    why = "an event, through the whole loop"
    if kills:
        why += " (every kill -9 of the Spark job came when it had applied all it had been given)"
    return why, last


def _applied_after(
    conn: psycopg.Connection[Any], schema: str, topic: str, kill: float
) -> list[tuple[float, int, int]]:
    """(when, partition, offset) of each record of `topic` the tracing sink applied after `kill`."""
    rows = conn.execute(
        sql.SQL(
            "SELECT extract(epoch FROM applied_at)::float8, r.p, r.o FROM {},"
            " unnest(topics, partitions, offsets) AS r (t, p, o)"
            " WHERE applied_at > to_timestamp(%s) AND r.t = %s"
        ).format(sql.Identifier(schema, tables.SINK_TRACES)),
        [kill, topic],
    ).fetchall()
    return [(float(when), int(p), int(o)) for when, p, o in rows]


def poison(topic: str, poisoned: Mapping[str, dict], at: Mapping[str, tuple[int, int]]) -> list[Pick]:
    return [
        _pick("the poison event (its number is not one), dead-lettered", e, topic, poisoned, at, dead=True)
        for e in poisoned
    ]


def run(pick: Pick, schema: str, url: str, bootstrap: str) -> Traced:
    """`outbox trace` as a user runs it: its lines to show, its JSON to check."""
    argv = ["trace", str(pick.account), "--at", f"{pick.at.topic}:{pick.at.partition}:{pick.at.offset}"]
    argv += ["--schema", schema, "--bootstrap-servers", bootstrap]
    env = {**os.environ, "DATABASE_URL": url}

    def outbox(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "outbox", *argv, *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )

    shown, checked = outbox(), outbox("--json")
    command = shlex.join(["outbox", *argv])
    output = (shown.stdout + shown.stderr).rstrip()
    try:
        problem = check(pick, json.loads(checked.stdout))
    except json.JSONDecodeError:
        problem = f"no JSON (exit {checked.returncode}): {checked.stderr.strip()}"
    return Traced(pick, command, output, not problem, problem)


def check(pick: Pick, trace: Mapping[str, Any]) -> str:
    """What is wrong with a trace's JSON for `pick`; empty when nothing is."""
    records, dead = trace.get("records", []), trace.get("dead_letters", [])
    if pick.dead_lettered:
        return "" if len(dead) == 1 and not records else f"not one dead letter alone: {trace}"
    if len(records) != 1 or dead:
        return f"not one input record: {trace}"
    record = records[0]
    box = record.get("outbox") or {}
    if record["outcome"] != "applied" or box.get("state") != "published" or not box.get("published"):
        return f"not applied and found published in the output topic: {record}"
    return ""


def _pick(
    why: str,
    event: str,
    topic: str,
    events: Mapping[str, dict],
    at: Mapping[str, tuple[int, int]],
    dead: bool = False,
) -> Pick:
    partition, offset = at[event]
    return Pick(why, int(events[event]["account"]), Position(topic, partition, offset), dead)


def _span(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _clock(wall: float) -> str:
    return f"{datetime.fromtimestamp(wall):%H:%M:%S}"
