"""Decisions of the demo, made up front from a seeded random generator: no I/O.

The filler's transactions: each event belongs to an account (the Kafka key)
and carries the account's next sequence number. A committed transaction uses
them up; an aborted one reuses the next numbers, so a leaked aborted event
would also break the order check. A redelivery sends an event already
committed again, in a later transaction: same event id, same sequence. A
poison event, committed once in the middle, has a number that is not one: the
sink dead-letters it, and nothing of it comes out.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    event_id: str
    account: int
    seq: int
    n: int
    poison: bool = False  # its number is sent as text that is not one

    def json(self) -> dict[str, object]:
        n = "not-a-number" if self.poison else self.n
        return {"event_id": self.event_id, "account": self.account, "seq": self.seq, "n": n}


@dataclass(frozen=True)
class Transaction:
    events: tuple[Event, ...]
    commit: bool
    redelivered: int = 0  # how many of the events are copies of committed ones


@dataclass(frozen=True)
class Kill:
    at: float  # seconds after the start
    component: str  # spark | relay | broker
    working: float = 0.0  # and not before the component has been at work this long since it started


def transactions(
    events: int,
    *,
    accounts: int,
    size: int,
    rng: random.Random,
    abort_rate: float = 0.1,
    redeliver_rate: float = 0.2,
    poison: bool = True,
) -> list[Transaction]:
    """Transactions committing `events` distinct events, plus aborted ones and redeliveries, and
    with `poison` one poison event in the transaction that passes half of the events."""
    next_seq = dict.fromkeys(range(1, accounts + 1), 1)
    committed: list[Event] = []
    out: list[Transaction] = []

    def fresh(consume: bool) -> Event:
        account = rng.randint(1, accounts)
        event = Event(
            str(uuid.UUID(int=rng.getrandbits(128))), account, next_seq[account], rng.randint(-(10**6), 10**6)
        )
        if consume:
            next_seq[account] += 1
        return event

    while len(committed) < events:
        if committed and rng.random() < abort_rate:
            out.append(Transaction(tuple(fresh(consume=False) for _ in range(size)), commit=False))
            continue
        batch = [fresh(consume=True) for _ in range(min(size, events - len(committed)))]
        copies: list[Event] = []
        if committed and rng.random() < redeliver_rate:
            copies = rng.sample(committed[-10 * size :], k=min(len(committed), max(1, size // 5)))
        bad: list[Event] = []
        if poison and len(committed) + len(batch) >= events / 2:
            poison = False  # once, and never among the events redelivered
            bad = [Event(str(uuid.UUID(int=rng.getrandbits(128))), rng.randint(1, accounts), 0, 0, True)]
        committed += batch
        mixed = batch + copies + bad
        rng.shuffle(mixed)
        # Shuffling must not reorder one account's new events: put them back in sequence.
        out.append(Transaction(_per_account_in_order(mixed), commit=True, redelivered=len(copies)))
    return out


def _per_account_in_order(events: list[Event]) -> tuple[Event, ...]:
    slots: dict[int, list[int]] = {}
    for i, e in enumerate(events):
        slots.setdefault(e.account, []).append(i)
    placed: list[Event | None] = [None] * len(events)
    for account, where in slots.items():
        ordered = sorted((e for e in events if e.account == account), key=lambda e: e.seq)
        for i, e in zip(where, ordered, strict=True):
            placed[i] = e
    return tuple(e for e in placed if e is not None)


def kills(window: float, *, spark: int, relay: int, broker: int, rng: random.Random) -> list[Kill]:
    """When each component dies: one kill at a random moment in each of `n` equal slots of the window.

    A restarted component is killed again only after it has worked for a random
    1-6 s, so that it dies mid-stream rather than mid-start. The broker restarts
    in the middle half of the window, when both other components have work.
    """
    out: list[Kill] = []
    for component, n in (("spark", spark), ("relay", relay)):
        slot = window / n if n else 0.0
        out += [
            Kill(slot * i + rng.uniform(0.15, 0.85) * slot, component, rng.uniform(1.0, 6.0))
            for i in range(n)
        ]
    out += [Kill(rng.uniform(0.25, 0.75) * window, "broker") for _ in range(broker)]
    return sorted(out, key=lambda k: k.at)
