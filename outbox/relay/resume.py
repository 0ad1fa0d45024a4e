"""Where a relay session starts: its position in Kafka, checked against what PostgreSQL durably knows.

A position is a pair of snapshots of the database, kept in Kafka. PostgreSQL can
go back in time under it: a crash that loses the WAL's unflushed tail (any crash
of a server without fsync), a failover to an asynchronous replica, a restore.
Transaction ids are then handed out again, and a new transaction whose id lies
below the position's horizon would count as published: skipped, then deleted by
cleanup.

So before a position is committed to Kafka, the relay commits a mark for its
snapshot in `relay_positions`, synchronously (`fetch` in outbox_table.py): the
WAL is flushed past every transaction the snapshot saw end. A database that
still holds that mark cannot have lost them; one that lacks it has gone back,
and the relay starts again from the mark's `base`, the last snapshot that
database knows was published. Events published since then come out again
(duplicates, which consumers drop by event id); none is lost. Only a database
of another cluster (pg_dump and restore, pg_upgrade, a wrong URL), whose ids
mean something else, is refused: `outbox relays rebase` is the way on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from outbox.errors import error
from outbox.relay.position import Position


@dataclass(frozen=True)
class Mark:
    """A relay shard's row in `relay_positions`."""

    base: str  # published when the mark was written
    target: str  # the snapshot being published
    number: int  # counts up with every mark; 0 after `outbox relays rebase`
    system: str  # the system identifier of the cluster that wrote it


@dataclass(frozen=True)
class Resumed:
    position: Position
    warning: str | None = None  # what an operator should know about where the relay starts


REBASED = 0


def resume(kafka: Position | None, mark: Mark | None, system: str, horizon: int, rebase: str) -> Resumed:
    """Where to start publishing, given the position in Kafka and the database's mark for this shard.

    system: the live database's system identifier; horizon: its next transaction
    id (the xmax of a snapshot taken now); rebase: the command that recovers
    from a refusal, for the message.
    """
    chosen = _choose(kafka, mark, system, rebase)
    position = replace(chosen.position, system=system)
    if position.horizon > horizon:
        raise error("RELAY_POSITION_AHEAD", base=position.base, horizon=horizon, rebase=rebase)
    return replace(chosen, position=position)


def _choose(kafka: Position | None, mark: Mark | None, system: str, rebase: str) -> Resumed:
    floor = kafka.mark if kafka else None  # marks written from now on count on from here
    if mark is not None and mark.number == REBASED:
        return Resumed(
            Position(mark.base, mark=floor),
            "rebased by `outbox relays rebase`: publishing every row left in the outbox again",
        )
    if kafka is None:
        if mark is None or mark.base == Position().base:  # nothing published yet: a first batch failed
            return Resumed(Position())
        return Resumed(
            Position(),
            "PostgreSQL has a mark for this relay but Kafka has no position (positions topic deleted or"
            " lost?): publishing every row left in the outbox again; consumers see duplicates",
        )
    stamped = kafka.system or (mark.system if mark else None)
    if stamped is not None and stamped != system:
        raise error("RELAY_POSITION_OTHER_CLUSTER", system=system, stamped=stamped, rebase=rebase)
    if mark is None:
        if kafka.mark is None:
            return Resumed(kafka)  # both from before marks: nothing to compare yet
        return Resumed(
            Position(mark=floor),
            "PostgreSQL has lost this relay's marks (restored from before them?): publishing every row"
            " left in the outbox again; consumers see duplicates",
        )
    if kafka.mark is None or mark.number >= kafka.mark:
        return Resumed(kafka)
    return Resumed(
        Position(mark.base, mark=floor),
        f"PostgreSQL went back in time under the relay (crash without fsync, failover to an asynchronous"
        f" replica, or restore): it holds mark {mark.number}, Kafka's position needs {kafka.mark}."
        f" Publishing again from {mark.base} (was {kafka.base}): events published since come out twice"
        " (consumers drop them by event id); none is lost",
    )
