"""The relay: publishes committed outbox rows to Kafka exactly once, in commit order per key.

position.py      where a relay stands, what it publishes next, where a halt stops (pure)
row.py           an outbox row, as the PostgreSQL edge hands it to the Kafka edge
outbox_table.py  PostgreSQL: the shard's lock, snapshot-delta reads, cleanup, dead letters
statements.py    the SQL outbox_table.py runs, composed once per shard
cleaner.py       cleanup on a session of its own, beside the publishing loop
kafka.py         Kafka: one transaction per batch, with the position
positions.py     the positions topic: made sure of, and read back at start
resume.py        where a session starts: Kafka's position against the database's mark (pure)
registry.py      the relays an outbox's database records: list, rebase, forget
poison.py        which Kafka errors are a record's fault, and which row they name
relay.py         the daemon loop tying them together
metrics.py       Prometheus /metrics, and the probes /livez and /readyz
"""

from outbox.relay.poison import DEAD_LETTER, HALT
from outbox.relay.position import Position, Shard
from outbox.relay.relay import Relay
from outbox.relay.settings import RelaySettings

__all__ = ["DEAD_LETTER", "HALT", "Position", "Relay", "RelaySettings", "Shard"]
