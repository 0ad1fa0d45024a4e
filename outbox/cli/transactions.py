"""`outbox transactions TOPIC`: the transactions that hold a topic's last stable offset back.

A transaction opened and never finished stalls every read_committed reader of
its partitions (the relay's consumers, `kafka_rc`, the sink) at its first
offset. Kafka's own tool (`kafka-transactions`, which the dev tools run from
its jars, with Java) says which are open: those a coordinator knows end by themselves at their timeout; a
*hanging* one (its coordinator lost track of it, as after the delayed-produce
cases KIP-890 closes) never ends and must be aborted by hand.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from outbox.core import plugins
from outbox.core.config import bootstrap_servers


@dataclass(frozen=True)
class Open:
    """A transaction open on the topic."""

    transactional_id: str
    producer: str  # id/epoch
    partitions: tuple[str, ...]
    seconds: float
    coordinator: str

    def line(self, older_than: float) -> str:
        kind = "LONG-OPEN" if self.seconds >= older_than else "open"
        return (
            f"{kind:9} {self.transactional_id} (producer {self.producer}, coordinator node"
            f" {self.coordinator}) on {', '.join(self.partitions)}, open {self.seconds:.0f} s:"
            " read_committed readers of these partitions wait for it; it ends at its"
            " transaction.timeout.ms, or when its producer comes back"
        )


@dataclass(frozen=True)
class Hanging:
    """A transaction no coordinator will end: its partition's LSO is stuck until it is aborted."""

    topic: str
    partition: str
    producer: str
    start_offset: str
    minutes: str

    def line(self, bootstrap: str) -> str:
        return (
            f"HANGING   producer {self.producer} on {self.topic}-{self.partition} from offset"
            f" {self.start_offset}, open {self.minutes} min: no coordinator will end it; abort it with"
            f" `kafka-transactions --bootstrap-server {bootstrap} abort --topic {self.topic}"
            f" --partition {self.partition} --start-offset {self.start_offset}`"
        )


def open_on(topic: str, described: list[dict[str, str]]) -> list[Open]:
    """Of `kafka-transactions describe` rows, the ongoing transactions that hold partitions of `topic`."""
    found = []
    for row in described:
        held = [p.strip() for p in row.get("TopicPartitions", "").split(",") if p.strip()]
        mine = tuple(p for p in held if p.rpartition("-")[0] == topic)
        if row.get("TransactionState") == "Ongoing" and mine:
            producer = f"{row.get('ProducerId')}/{row.get('ProducerEpoch')}"
            seconds = int(row.get("TransactionDurationMs") or 0) / 1000
            found.append(Open(row["TransactionalId"], producer, mine, seconds, row.get("CoordinatorId", "?")))
    return found


def hanging(rows: list[dict[str, str]]) -> list[Hanging]:
    """`kafka-transactions find-hanging` rows."""
    return [
        Hanging(
            r["Topic"],
            r["Partition"],
            f"{r.get('ProducerId')}/{r.get('ProducerEpoch')}",
            r["StartOffset"],
            r.get("Duration(min)", "?"),
        )
        for r in rows
    ]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "transactions",
        help="list the open and hanging transactions that hold a topic's last stable offset back",
        description=__doc__,
    )
    p.add_argument("topic")
    p.add_argument("--bootstrap-servers", help="Kafka host:port list (env KAFKA_BOOTSTRAP_SERVERS)")
    p.add_argument(
        "--older-than",
        type=float,
        default=60.0,
        help="seconds after which an open transaction is reported as LONG-OPEN (default 60)",
    )
    p.set_defaults(handler=cmd_transactions)


def find(servers: str, topics: list[str]) -> tuple[list[Open], list[Hanging]]:
    """The transactions open on `topics`, and those hanging there, as Kafka's own tool sees them."""
    run = plugins.tool("kafka-transactions", needed_by="listing transactions")
    ongoing = [
        row["TransactionalId"] for row in run(servers, "list") if row.get("TransactionState") == "Ongoing"
    ]
    described = [row for tid in ongoing for row in run(servers, "describe", "--transactional-id", tid)]
    opened = [o for topic in topics for o in open_on(topic, described)]
    stuck = [h for topic in topics for h in hanging(run(servers, "find-hanging", "--topic", topic))]
    return opened, stuck


def cmd_transactions(args: argparse.Namespace) -> int:
    servers = bootstrap_servers(args.bootstrap_servers)
    opened, stuck = find(servers, [args.topic])
    for found in opened:
        print(found.line(args.older_than))
    for lost in stuck:
        print(lost.line(servers))
    late = [o for o in opened if o.seconds >= args.older_than]
    print(
        f"{args.topic}: {len(opened)} open transaction(s), {len(late)} open {args.older_than:.0f} s or"
        f" longer, {len(stuck)} hanging"
    )
    return 1 if late or stuck else 0
