"""The relay's position store: a compacted topic, one record per relay, outbox and shard.

As Kafka Connect keeps its offset store apart from the task, this module only
reads the store and makes sure it exists; the Publisher writes each position
inside the transaction of the records it covers, and `position.latest_position`
decides which record is this relay's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, NewTopic

from outbox.core.committed import read_committed
from outbox.core.errors import ConfigError
from outbox.core.kafka import client_settings
from outbox.errors import error
from outbox.relay.acls import Access
from outbox.relay.position import Identity, Position, latest_position

log = logging.getLogger("outbox.relay")
T = TypeVar("T")
# Refusals of the topic's creation that no retry changes: the operator creates it (or grants the right).
_REFUSED = frozenset(
    {
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_REPLICA_ASSIGNMENT,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.TOPIC_EXCEPTION,  # a name Kafka does not take
        KafkaError.INVALID_REQUEST,
        KafkaError.UNSUPPORTED_VERSION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


def replication(brokers: int) -> tuple[int, dict[str, str]]:
    """The positions topic's replication factor and settings on a cluster of `brokers`.

    Losing the positions means publishing again everything left in the outbox:
    three replicas where there are three brokers, two of them in sync for a write.
    Kafka never compacts a log's open segment, by default open for 1 GiB or 7
    days: millions of records a relay read at each session's start. Segments of
    16 MiB (about 50,000 positions) or an hour keep it to the last position per
    key and what came since. Never an unclean leader election, whatever the
    cluster's default: a replica out of sync made leader drops the latest ones.
    """
    factor = max(1, min(3, brokers))
    return factor, {
        "cleanup.policy": "compact",
        "min.insync.replicas": str(in_sync(factor)),
        "segment.bytes": str(SEGMENT_BYTES),
        "segment.ms": str(SEGMENT_MS),
        "unclean.leader.election.enable": "false",
    }


SEGMENT_BYTES, SEGMENT_MS = 16 * 2**20, 3_600_000


def in_sync(replicas: int) -> int:
    """The replicas a position's write needs: two where there are three, so that one broker down
    stops nothing and a position is never held by one broker only; one below three."""
    return min(2, max(1, replicas - 1))


def cluster_size(metadata: ClusterMetadata) -> int:
    """The cluster's brokers, up or down. Kafka's metadata lists the live ones only, so a relay first
    started during a restart took two for three; but it names every replica of every partition."""
    named = {r for t in metadata.topics.values() for p in t.partitions.values() for r in p.replicas}
    return len(named | set(metadata.brokers))


def problems(
    topic: str, replicas: int, brokers: int, config: Mapping[str, str | None], partitions: int = 1
) -> list[str]:
    """What is wrong with an existing positions topic (its replicas, its `config`, its partitions), as
    lines an operator can act on."""
    found = []
    policy = config.get("cleanup.policy") or "delete"
    wanted, _ = replication(brokers)
    if replicas < wanted:
        found.append(
            f"the relay positions topic {topic!r} has {replicas} replica(s) on a cluster of {brokers}:"
            f" losing its broker loses every relay's position (each then publishes its outbox again)."
            f" Reassign it to {wanted} replicas (kafka-reassign-partitions)"
        )
    taken, least = int(config.get("min.insync.replicas") or 1), in_sync(replicas)
    if taken < least:
        found.append(
            f"the relay positions topic {topic!r} takes a write on {taken} of its {replicas} replicas"
            f" (min.insync.replicas={taken}): a position only one broker held is lost with it, and the"
            f" relay then publishes again what its outbox still holds. Set min.insync.replicas={least}"
        )
    if config.get("unclean.leader.election.enable") == "true":
        found.append(
            f"the relay positions topic {topic!r} allows an unclean leader election: a replica out of"
            " sync made leader drops the latest positions, and the relay then publishes again what its"
            " outbox still holds. Set unclean.leader.election.enable=false"
        )
    if policy.split(",") != ["compact"]:
        found.append(
            f"the relay positions topic {topic!r} is not compacted only (cleanup.policy={policy}): retention"
            " will delete the positions of relays idle that long, which then publish again what their"
            " outbox still holds. Set cleanup.policy=compact"
        )
    if partitions > 1:
        found.append(
            f"the relay positions topic {topic!r} has {partitions} partitions, not the one partition"
            " the relay makes it with: partitions added move a relay's key to another one, and its old"
            " position stays in the first. The relay takes the furthest, but positions written by a"
            " relay from before marks cannot be told apart (it may then publish again what its outbox"
            " still holds). Add no partitions to it"
        )
    wanted_segments = (("segment.bytes", SEGMENT_BYTES), ("segment.ms", SEGMENT_MS))
    longer = [f"{k}={config[k]}" for k, most in wanted_segments if int(config.get(k) or 0) > most]
    if longer:
        found.append(
            f"the relay positions topic {topic!r} keeps a segment open up to {' or '.join(longer)}:"
            " Kafka never compacts an open segment, and each relay session's start reads the topic"
            f" whole. Set segment.bytes={SEGMENT_BYTES} and segment.ms={SEGMENT_MS} (kafka-configs --alter)"
        )
    return found


class PositionStore:
    def __init__(self, access: Access, settings: Mapping[str, object], timeout: float) -> None:
        self.topic, self.bootstrap = access.positions_topic, access.bootstrap
        self.access, self.settings, self.timeout = access, settings, timeout

    def latest(self, relay: Identity) -> Position | None:
        """This relay's last committed position (None: it never ran), creating the topic if need be."""
        self.ensure_topic()
        return latest_position(self.records(relay.name), relay)

    def ensure_topic(self) -> None:
        """Create the topic, replicated as `replication` says; or warn about an existing one."""
        admin = AdminClient(client_settings(self.settings, "admin", bootstrap=self.bootstrap))
        metadata = admin.list_topics(timeout=self.timeout)
        live, brokers = len(metadata.brokers), cluster_size(metadata)
        existing = metadata.topics.get(self.topic)
        if existing is not None and existing.error is not None and self.access.grant(existing.error):
            raise KafkaException(existing.error)  # there, but not the relay's to see
        if existing is not None and existing.error is None:
            replicas = min((len(p.replicas) for p in existing.partitions.values()), default=0)
            resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
            configs = answer(admin.describe_configs([resource])[resource], self.timeout)
            values = {name: entry.value for name, entry in configs.items()}
            for problem in problems(self.topic, replicas, brokers, values, len(existing.partitions)):
                log.warning(problem)
            return
        factor, config = replication(brokers)
        if live < factor:  # as Kafka waits to make its own internal topics: made short, it stays short
            raise error(
                "RELAY_POSITIONS_TOPIC_WAITING", topic=self.topic, replicas=factor, live=live, brokers=brokers
            )
        topic = NewTopic(self.topic, 1, factor, config=config)
        for future in admin.create_topics([topic]).values():
            try:
                answer(future, self.timeout)
            except KafkaException as exc:
                failure = exc.args[0]
                if failure.code() == KafkaError.TOPIC_ALREADY_EXISTS:  # made meanwhile, or not ours to see
                    self._wait_for_leader(admin)
                    return
                if not refused(failure):
                    raise  # Kafka not answering now (a timeout, a broker leaving): asked again
                if (not_granted := self.access.refused(failure, create=True)) is not None:
                    raise not_granted from None
                raise error(
                    "RELAY_POSITIONS_TOPIC_NOT_CREATED",
                    topic=self.topic,
                    reason=failure.str(),
                    replicas=factor,
                ) from None
        log.info("created positions topic", extra={"topic": self.topic, "replicas": factor, **config})
        self._wait_for_leader(admin)

    def _wait_for_leader(self, admin: AdminClient) -> None:
        """A topic just created is known to the other brokers of a cluster a moment later."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            found = admin.list_topics(self.topic, timeout=self.timeout).topics.get(self.topic)
            if found is not None and found.error is not None and self.access.grant(found.error):
                raise KafkaException(found.error)  # made, but not the relay's to see
            leaders = [p.leader for p in found.partitions.values()] if found is not None else []
            if found is not None and found.error is None and min(leaders, default=-1) >= 0:
                return
            time.sleep(0.2)
        raise error("RELAY_POSITIONS_TOPIC_NO_LEADER", topic=self.topic, timeout=self.timeout)

    def records(self, name: str) -> list[tuple[bytes | None, bytes | None]]:
        """Every committed record of the topic, in order, up to its high watermark now
        (a position of ours may lie beyond another relay's still-open transaction)."""
        config = client_settings(
            {**self.settings, "group.id": f"outbox-relay-positions.{name}"},
            "consumer",
            bootstrap=self.bootstrap,
        )
        stuck = (
            f"the positions topic {self.topic!r} was not read to its end in {self.timeout * 4:.0f}s:"
            " a transaction still open (another relay's, not yet timed out), or Kafka slow to answer"
        )

        def held(where: str) -> None:
            log.warning(
                "the positions topic %r is held by a transaction still open (%s): another relay's, or"
                " another shard's, which every relay sharing the topic waits for. This one starts when"
                " it commits or aborts (Kafka aborts it at its transaction.timeout.ms), or gives up"
                " after %.0fs. A relay of its own positions topic (--positions-topic) waits for none",
                self.topic,
                where,
                self.timeout * 4,
            )

        try:
            messages = read_committed(config, self.topic, timeout=self.timeout * 4, stuck=stuck, held=held)
        except ConfigError as exc:
            if exc.code != "KAFKA_TOPIC_MISSING":
                raise
            # ensure_topic has just seen it: the broker asked has not caught up with the cluster yet
            raise error("RELAY_POSITIONS_TOPIC_UNKNOWN", topic=self.topic) from None
        return [(m.key(), m.value()) for m in messages]


def refused(failure: KafkaError) -> bool:
    """Whether a failed creation is a refusal no retry changes; else Kafka is not answering now."""
    return failure.code() in _REFUSED


def answer(future: Future[T], timeout: float) -> T:
    """An admin request's result. Python's wait running out is Kafka not answering, as librdkafka's
    own is (a KafkaException the relay retries), not a TimeoutError that would end the process."""
    try:
        return future.result(timeout)
    except TimeoutError:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no answer in {timeout:.0f}s")) from None
