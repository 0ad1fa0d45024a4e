"""The relay: publishes committed outbox rows to Kafka exactly once, in commit order per key.

position.py      where a relay stands and what it publishes next (pure)
outbox_table.py  Postgres: the shard's lock, snapshot-delta reads, cleanup
kafka.py         Kafka: one transaction per batch with the position; reading it back
poison.py        which Kafka errors are a record's fault
relay.py         the daemon loop tying them together
metrics.py       Prometheus /metrics and /healthz
"""

from outbox.relay.poison import DEAD_LETTER, HALT
from outbox.relay.position import Position, Shard
from outbox.relay.relay import Relay, RelaySettings

__all__ = ["DEAD_LETTER", "HALT", "Position", "Relay", "RelaySettings", "Shard"]
