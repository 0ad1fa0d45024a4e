"""The demo's last word: `outbox trace` of an event the Spark job was killed with, and of the poison one.

Which event was in flight is decided from what the run recorded: of those
committed to Kafka before a kill -9 of the Spark job that the sink's traces
say it applied after the restart, the one committed closest to its kill. The command is then run as a
user runs it, and its JSON checked: the event applied once and published,
the poison one dead-lettered and nothing else.
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

from outbox.trace import gather
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


def before(kill: float, committed_at: Mapping[str, float], most: int = 50) -> list[str]:
    """Event ids committed to Kafka before `kill` (wall time), the latest first: the likeliest to
    have been in Kafka but not yet in PostgreSQL when the job died."""
    earlier = [(t, e) for e, t in committed_at.items() if t < kill]
    return [e for _, e in sorted(earlier, reverse=True)[:most]]


def in_flight(
    conn: psycopg.Connection[Any],
    schema: str,
    topic: str,
    kills: Sequence[float],
    committed_at: Mapping[str, float],
    events: Mapping[str, dict],
    at: Mapping[str, tuple[int, int]],
) -> Pick | None:
    """Of the events committed before a kill -9 of the Spark job and applied after its restart, the
    one committed closest to its kill; with no kill, the last event committed."""
    if not kills:
        last = before(float("inf"), committed_at, 1)
        return _pick("an event, through the whole loop", last[0], topic, events, at) if last else None
    best: tuple[float, float, str] | None = None  # how long before the kill, the kill, the event
    for kill in kills:
        for event in before(kill, committed_at):
            pick = _pick("", event, topic, events, at)
            found = gather.from_database(conn, schema, str(pick.account)).only(pick.at).records
            if found and found[0].outcome == "applied" and found[0].at.timestamp() > kill:
                ahead = kill - committed_at[event]
                best = min(best or (ahead, kill, event), (ahead, kill, event))
                break  # the latest one before this kill that the restart applied
    if best is None:
        return None
    ahead, kill, event = best
    why = (
        f"an event in flight: committed to Kafka {_span(ahead)} before a kill -9 of the Spark job"
        f" (at {_clock(kill)}), applied after its restart"
    )
    return _pick(why, event, topic, events, at)


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
