"""The input producer: the planned transactions, paced over the fill window, each until it lands.

A committed transaction that fails (the broker restarting under it) is
aborted and sent again, as a real producer would: if the failed commit did
land after all, the second copy is one more redelivery for the sink to skip.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from confluent_kafka import KafkaException, Producer

from demos.loop.formats import Encode, json_value
from demos.loop.plan import Transaction
from outbox.core.kafka import client_settings


class Filler(threading.Thread):
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        plan: Sequence[Transaction],
        window: float,
        encode: Encode = json_value,
    ) -> None:
        super().__init__(name="filler", daemon=True)
        self.bootstrap, self.topic, self.plan, self.window = bootstrap, topic, plan, window
        self.encode = encode
        self.committed_at: dict[str, float] = {}  # event id -> wall time its first commit returned
        self.aborted = self.redelivered = self.retried = 0
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    @property
    def committed(self) -> int:
        return len(self.committed_at)

    def run(self) -> None:
        try:
            producer = self._producer()
            start = time.monotonic()
            for i, txn in enumerate(self.plan):
                due = start + self.window * i / max(1, len(self.plan))
                if self.stopping.wait(max(0.0, due - time.monotonic())):
                    return
                while not self._send(producer, txn):
                    if self.stopping.wait(1.0):
                        return
                    self.retried += 1
                    producer = self._producer()
        except BaseException as exc:  # reported by the conductor, which stops the run
            self.error = exc

    def _producer(self) -> Producer:
        producer = Producer(
            client_settings(
                {
                    "bootstrap.servers": self.bootstrap,
                    "transactional.id": f"demo-fill-{self.topic}",
                    "partitioner": "murmur2_random",
                    "linger.ms": 5,
                    "transaction.timeout.ms": 30000,
                },
                "producer",
            )
        )
        while True:  # the broker may be restarting
            try:
                producer.init_transactions(30)
                return producer
            except KafkaException:
                if self.stopping.wait(1.0):
                    raise

    def _send(self, producer: Producer, txn: Transaction) -> bool:
        """True once the transaction is committed (or, if planned so, aborted)."""
        try:
            producer.begin_transaction()
            for e in txn.events:
                producer.produce(self.topic, key=str(e.account).encode(), value=self.encode(e.json()))
            producer.flush(30)
            if txn.commit:
                producer.commit_transaction(30)
            else:
                producer.abort_transaction(30)
        except KafkaException:
            return False
        if txn.commit:
            now = time.time()
            for e in txn.events:
                if not e.poison:  # dead-lettered by the sink: never out, so no latency
                    self.committed_at.setdefault(e.event_id, now)
            self.redelivered += txn.redelivered
        else:
            self.aborted += 1
        return True
