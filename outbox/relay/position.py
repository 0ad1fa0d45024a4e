"""Where a relay stands, and what it publishes next: plain values and decisions, no I/O.

A position says which committed outbox rows are already in Kafka:

- every row whose writing transaction is visible in the snapshot `base`;
- plus, while a delta is being published in parts, the rows of the delta
  `(base, target]` (visible in `target`, not in `base`) with `id <= after_id`.

Snapshots are PostgreSQL `pg_snapshot` texts (`xmin:xmax:xip,...`). A
transaction still open in `base` is in its xip list, so its rows belong to a
later delta however late it commits: nothing is skipped, and no id order is
assumed across transactions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from outbox.errors import error

# The snapshot before any transaction: every row of the table is in the first delta.
EMPTY_SNAPSHOT = "1:1:"

_SNAPSHOT = re.compile(r"^\d+:\d+:(\d+(,\d+)*)?$")
_FORMAT = 1


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count`: the rows whose key hashes to index (md5, first 32 bits, mod count)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not match:
            raise error("RELAY_SHARD_MALFORMED", text=text)
        index, count = int(match[1]), int(match[2])
        if count < 1 or not 0 <= index < count:
            raise error("RELAY_SHARD_OUT_OF_RANGE", text=text)
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class Identity:
    """Which relay: its name, the outbox it reads (the id `outbox db upgrade` stored there), its shard.

    A position holds snapshots of one database, so it must only ever be applied
    to the outbox it was read from: every key, transactional.id and position
    record carries the outbox id, and the same name on another schema or
    database is another relay.
    """

    name: str
    outbox: str
    shard: Shard = Shard()

    @property
    def position_key(self) -> bytes:
        return f"{self.name}/{self.outbox}/{self.shard.index}-of-{self.shard.count}".encode()

    @property
    def transactional_id(self) -> str:
        """Stable per relay, outbox and shard, so a restarted or standby instance fences the old one."""
        return f"outbox-relay.{self.name}.{self.outbox}.{self.shard.index}-of-{self.shard.count}"


class Target(NamedTuple):
    """The snapshot a delta is read up to, and the durable mark that covers it (None: none yet)."""

    snapshot: str
    mark: int | None


@dataclass(frozen=True)
class Position:
    """base, target, after_id: which rows are in Kafka (see above).

    mark: the number of the relay's mark in `relay_positions` (resume.py) that
    PostgreSQL had durably committed, covering these snapshots, before this
    position was committed to Kafka; new marks count on from it (None: written
    by a relay older than marks).
    system: the system identifier of the PostgreSQL cluster the snapshots are of.
    """

    base: str = EMPTY_SNAPSHOT
    target: str | None = None
    after_id: int = 0
    mark: int | None = None
    system: str | None = None

    def to_json(self, relay: Identity) -> bytes:
        return json.dumps(
            {
                "format": _FORMAT,
                "relay": relay.name,
                "outbox": relay.outbox,
                "shard": relay.shard.index,
                "shards": relay.shard.count,
                "base": self.base,
                "target": self.target,
                "after_id": self.after_id,
                "mark": self.mark,
                "system": self.system,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> tuple[Position, Identity]:
        try:
            doc = json.loads(data)
            mark, system = doc.get("mark"), doc.get("system")
            position = cls(
                doc["base"],
                doc["target"],
                int(doc["after_id"]),
                None if mark is None else int(mark),
                None if system is None else str(system),
            )
            relay = Identity(
                str(doc["relay"]), str(doc["outbox"]), Shard(int(doc["shard"]), int(doc["shards"]))
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise error("RELAY_POSITION_UNREADABLE", reason=exc, data=data[:200]) from None
        for snapshot in (position.base, position.target):
            if snapshot is not None and not _SNAPSHOT.match(snapshot):
                raise error("RELAY_POSITION_SNAPSHOT_MALFORMED", snapshot=snapshot)
        return position, relay

    @property
    def horizon(self) -> int:
        """The first transaction id this position's snapshots know nothing of."""
        return max(xmax(self.base), xmax(self.target) if self.target else 0)


def xmax(snapshot: str) -> int:
    return int(snapshot.split(":", 2)[1])


def latest_position(records: Sequence[tuple[bytes | None, bytes | None]], relay: Identity) -> Position | None:
    """The last committed position of this relay (name, outbox, shard) in the positions topic.

    The `further` one, the last read among equals: partitions added to the
    topic move the relay's key, and the partitions are read one after another,
    so the last read may be an old one.

    Refuses to start a shard layout that differs from the one already recorded
    for this name and outbox (shards of different layouts would disagree about
    which rows are theirs), and a record under this relay's key that names
    another outbox (a position is only ever applied to the outbox it was read from).
    """
    prefix = f"{relay.name}/{relay.outbox}/".encode()
    found: Position | None = None
    layouts: dict[int, bytes] = {}
    for key, value in records:
        if key is None or not key.startswith(prefix) or value is None:
            continue
        position, recorded = Position.from_json(value)
        if recorded.outbox != relay.outbox or recorded.name != relay.name:
            raise error(
                "RELAY_POSITION_OTHER_OUTBOX",
                key=key.decode(errors="replace"),
                recorded=recorded.name,
                recorded_outbox=recorded.outbox,
                relay=relay.name,
                outbox=relay.outbox,
            )
        layouts[recorded.shard.count] = key
        if key == relay.position_key and (found is None or not further(found, position)):
            found = position
    others = sorted(count for count in layouts if count != relay.shard.count)
    if others:
        raise error("RELAY_SHARD_COUNT_CHANGED", relay=relay.name, count=others[-1], shard=relay.shard)
    return found


def further(a: Position, b: Position) -> bool:
    """Whether the relay wrote `a` after `b`, in the order it writes positions: each delta with rows
    takes a new, higher mark, its batches count up `after_id`, and its end finishes it. A position
    from before marks comes before every one with a mark; two such cannot be told apart (False)."""
    if a.mark is None and b.mark is None:
        return False
    return _order(a) > _order(b)


def _order(p: Position) -> tuple[int, bool, int]:
    return (-1 if p.mark is None else p.mark, p.target is None, p.after_id)


@dataclass(frozen=True)
class Step:
    """What one batch publishes: the first `count` fetched rows, then the relay stands at `position`."""

    count: int
    position: Position
    persist: bool


def advance(
    position: Position, target: Target, fetched_ids: Sequence[int], limit: int, cut: bool = False
) -> Step:
    """Decide the next position after fetching up to limit+1 rows of the delta (position, target], by id.

    A full fetch (more than `limit` rows), or one its byte budget `cut`, publishes
    up to `limit` rows and records how far into the delta it got. A short fetch
    finishes the delta: `target` becomes the new base. An empty fetch moves the
    base without a Kafka transaction; the old base stays valid in Kafka, since
    nothing lay between.
    """
    if len(fetched_ids) > limit or (cut and fetched_ids):
        count = min(limit, len(fetched_ids))
        return Step(count, _within(position, target, fetched_ids[count - 1]), persist=True)
    finished = Position(target.snapshot, mark=target.mark, system=position.system)
    return Step(len(fetched_ids), finished, persist=bool(fetched_ids))


def rows_before(fetched_ids: Sequence[int], poison_id: int) -> int:
    """How many of a batch's rows a relay halting on row `poison_id` still publishes: those before it.

    Publishing past a poison row would break order. The rows before it go out as
    a batch of their own, through the same checks as any (one of them may turn
    out poison too, as only sending shows a record too large); the poison row is
    then the first of the next batch, and the relay halts with nothing to publish.
    """
    return sum(1 for row_id in fetched_ids if row_id < poison_id)


def _within(position: Position, target: Target, after_id: int) -> Position:
    """Part of the delta (position.base, target] published, up to row after_id."""
    return Position(position.base, target.snapshot, after_id, target.mark, position.system)
