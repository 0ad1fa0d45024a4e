"""What the driver asks the cluster: which partitions exist and their offsets.

Latest offsets are asked for with read_committed isolation, so the broker
answers with the Last Stable Offset: a batch never ends inside a transaction
that is still open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, OffsetSpec, TopicMetadata

from outbox.core.kafka import client_settings
from sinks.errors import error
from sinks.kafka_source.options import SourceOptions
from sinks.kafka_source.ranges import TopicPartitionKey
from sinks.kafka_source.stalls import names

log = logging.getLogger("sinks.kafka_source")
ATTEMPT = 10.0  # seconds one request may take before it is asked again, of another broker if need be
T = TypeVar("T")


def admin_settings(options: SourceOptions) -> dict[str, Any]:
    """librdkafka settings for the driver's admin client: the reader's, and connections kept.

    With sparse connections (librdkafka's default), an admin request for a partition whose leader
    is down has the leader's broker thread connect again at once after each refusal, without the
    reconnect backoff (librdkafka 2.16): tens of thousands of attempts, and most of a core, until
    the cluster names a new leader. A kept connection reconnects with the backoff. A `kafka.`
    option may still say otherwise.
    """
    return {"enable.sparse.connections": False, **client_settings(options.consumer_config(), "admin")}


class Cluster:
    """The driver's questions to Kafka, each waiting out a cluster that does not answer.

    A broker restart or a leader election passes in seconds; a cluster below
    quorum, until an operator acts. A question that fails for a reason that passes
    by itself (`transient`) is asked again: for `patience` seconds (the option
    unavailableTimeoutMs; by default for ever in a stream, 30 s in a batch
    query), saying so in one line once Kafka has not answered for `timeout`
    seconds, and in one more when it answers again.
    """

    def __init__(self, options: SourceOptions, *, waits: bool = True, timeout: float = 30.0) -> None:
        self.options = options
        self.timeout = timeout
        self.patience = options.unavailable_timeout_s or (None if waits else timeout)
        self.admin = self._connect()

    def __getstate__(self) -> dict[str, Any]:
        """Without the admin client, a connection and not a value: Spark Connect pickles the sink's
        batch function, and with it this, to run it beside the server."""
        return {k: v for k, v in self.__dict__.items() if k != "admin"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.admin = self._connect()

    def _connect(self) -> AdminClient:
        return AdminClient(admin_settings(self.options))

    def partitions(self) -> list[TopicPartitionKey]:
        """Partitions of the subscribed topics; a named topic that is missing is an error."""
        metadata = self._metadata()
        found = [
            (name, pid)
            for name, topic in metadata.topics.items()
            if self.options.matches(name) and topic.error is None
            for pid in topic.partitions
        ]
        missing = sorted(set(self.options.topics) - {name for name, _ in found})
        if missing:
            raise error(
                "KAFKA_RC_TOPIC_MISSING", topics=", ".join(missing), servers=self.options.bootstrap_servers
            )
        return sorted(found)

    def topics(self) -> set[str]:
        """Every topic on the cluster, subscribed or not."""
        return set(self._metadata().topics)

    def _metadata(self) -> ClusterMetadata:
        return self._ask("read the cluster's metadata", lambda: self.admin.list_topics(timeout=ATTEMPT))

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Kafka's id of each topic that exists: a topic created again under its name has another."""
        names = sorted(set(topics))
        if not names:
            return {}

        def ask() -> dict[str, str]:
            futures = self.admin.describe_topics(TopicCollection(names), request_timeout=ATTEMPT)
            ids: dict[str, str] = {}
            for name, future in futures.items():
                try:
                    ids[name] = str(future.result().topic_id)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
            return ids

        return self._ask("describe topics", ask)

    def _ask(self, doing: str, ask: Callable[[], T]) -> T:
        began, attempts, said = time.monotonic(), 0, False
        where = self.options.bootstrap_servers
        while True:
            try:
                answer = ask()
            except KafkaException as exc:
                failed, waited = exc.args[0], time.monotonic() - began
                if not transient(failed):
                    raise error(
                        "KAFKA_RC_REQUEST_FAILED", doing=doing, servers=where, reason=failed.str()
                    ) from None
                if self.patience is not None and waited >= self.patience:
                    raise error(
                        "KAFKA_RC_CLUSTER_UNAVAILABLE",
                        doing=doing,
                        servers=where,
                        reason=failed.str(),
                        seconds=waited,
                    ) from None
                if not said and waited >= self.timeout:
                    log.warning(
                        "Kafka at %s has not answered for %.0fs (cannot %s: %s); waiting for it"
                        " (option unavailableTimeoutMs)",
                        where, waited, doing, failed.str(),
                    )  # fmt: skip
                    said = True
                log.debug("asking again, could not %s: %s (%s)", doing, failed.str(), failed.name())
                attempts += 1
                time.sleep(min(1.0, 0.1 * attempts))
                # librdkafka keeps sending some requests to the broker its metadata named as the
                # controller, dead or not: a new client asks a live broker which one it is now.
                self.admin = self._connect()
                continue
            if said:
                log.warning("Kafka at %s answers again after %.0fs", where, time.monotonic() - began)
            return answer

    # partial: a partition without a leader (the brokers of its replicas are down) is left out of
    # the answer, and the others are answered; else the question waits for it.
    def earliest(
        self, partitions: Iterable[TopicPartitionKey], *, partial: bool = False
    ) -> dict[TopicPartitionKey, int]:
        return self._list_offsets(partitions, OffsetSpec.earliest(), partial=partial)

    def latest(
        self, partitions: Iterable[TopicPartitionKey], *, partial: bool = False
    ) -> dict[TopicPartitionKey, int]:
        return self._list_offsets(partitions, OffsetSpec.latest(), partial=partial)

    def high_watermarks(
        self, partitions: Iterable[TopicPartitionKey], *, partial: bool = False
    ) -> dict[TopicPartitionKey, int]:
        """The ends of the logs, open transactions' records included."""
        return self._list_offsets(partitions, OffsetSpec.latest(), uncommitted=True, partial=partial)

    def log_ends(
        self, begin: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, int]:
        """Where each log ends, for the check that `begin` is not past it (a truncated log): its last
        stable offset, or, where `begin` lies past that, its high watermark. A start between the two
        (from a read_uncommitted tool, or a ledger Spark's own source wrote) is inside a transaction
        still open: waited for, not a loss."""
        past = [tp for tp, offset in begin.items() if tp in latest and offset > latest[tp]]
        return {**latest, **(self.high_watermarks(past, partial=True) if past else {})}

    def max_transaction_timeout(self, default: float = 900.0) -> float:
        """Seconds the brokers let a transaction live (transaction.max.timeout.ms); `default` if unsaid."""
        try:
            broker = str(next(iter(self._metadata().brokers)))
            resource = ConfigResource(ConfigResource.Type.BROKER, broker)
            entry = self.admin.describe_configs([resource])[resource].result(self.timeout)
            return int(entry["transaction.max.timeout.ms"].value) / 1000
        # TimeoutError: the broker asked is down (a node killed while the stream is young).
        except (KafkaException, TimeoutError, KeyError, StopIteration, ValueError, TypeError):
            return default

    def _list_offsets(
        self,
        partitions: Iterable[TopicPartitionKey],
        spec: OffsetSpec,
        *,
        uncommitted: bool = False,
        partial: bool = False,
    ) -> dict[TopicPartitionKey, int]:
        wanted = {TopicPartition(t, p): spec for t, p in partitions}
        isolation = (
            IsolationLevel.READ_UNCOMMITTED
            if self.options.read_uncommitted or uncommitted
            else IsolationLevel.READ_COMMITTED
        )
        leaderless: set[TopicPartitionKey] = set()  # left out of a partial answer

        def ask() -> dict[TopicPartitionKey, int]:
            asked = {tp: s for tp, s in wanted.items() if (tp.topic, tp.partition) not in leaderless}
            if not asked:
                return {}
            try:
                futures = self.admin.list_offsets(asked, isolation_level=isolation, request_timeout=ATTEMPT)
                offsets = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            except KafkaException as exc:
                failed = exc.args[0]
                # librdkafka says a partition has no leader in more than one way (LEADER_NOT_AVAILABLE,
                # "No leaders found" for the whole request): the metadata tells.
                if partial and (found := without_leader(self._topics(), asked)):
                    leaderless.update(found)  # the others are asked again
                    return ask()
                if transient(failed):
                    raise
                waiting = leader_wait(failed, self._topics(), asked)
                if waiting:
                    raise _no_leader("no leader for", waiting) from None
                raise
            # A partition without a leader can come back as offset -1001: no answer, not a log's end.
            unanswered = [tp for tp, offset in offsets.items() if offset < 0]
            if partial:
                return {tp: offset for tp, offset in offsets.items() if offset >= 0}
            if unanswered:
                raise _no_leader("no offset for", unanswered)
            return offsets

        return self._ask("list offsets", ask)

    def _topics(self) -> dict[str, TopicMetadata]:
        return self.admin.list_topics(timeout=ATTEMPT).topics


def leader_wait(
    failed: KafkaError, topics: Mapping[str, TopicMetadata], partitions: Iterable[TopicPartition]
) -> list[TopicPartitionKey]:
    """The partitions an offsets request that failed with `failed` waits for, as the cluster's
    metadata `topics` shows them after; none: the failure is the caller's to say, now.

    librdkafka fails a whole request ("No leaders found", _NOENT) when a partition has no leader:
    its only replicas' brokers are down. The metadata names those; or shows every one led again
    by now (a broker came back meanwhile), and the request is asked again. A partition gone (its
    topic deleted, or made again smaller) is not waited for.
    """
    wanted = list(partitions)
    found = without_leader(topics, wanted)
    if not found and found is not None and failed.code() == KafkaError._NOENT:
        return [(tp.topic, tp.partition) for tp in wanted]
    return found or []


def without_leader(
    topics: Mapping[str, TopicMetadata], partitions: Iterable[TopicPartition]
) -> list[TopicPartitionKey] | None:
    """The partitions the metadata `topics` shows with no leader; None if one of them is gone."""
    found = []
    for tp in partitions:
        topic = topics.get(tp.topic)
        partition = topic.partitions.get(tp.partition) if topic is not None else None
        if partition is None:
            return None
        if partition.leader < 0:
            found.append((tp.topic, tp.partition))
    return found


def _no_leader(what: str, partitions: list[TopicPartitionKey]) -> KafkaException:
    """A transient error naming (some of) the partitions that have no leader to answer for them."""
    return KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"{what} {names(partitions)}"))


# A partition just added, or whose leader just moved, answers with these for a moment; a
# broker that is down or cut off, or a cluster below quorum or min.insync, until it is back.
_TRANSIENT = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader whose high watermark is not caught up
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_CONTROLLER,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    # A broker that left the cluster's metadata (stopped in a rolling restart): librdkafka drops its
    # handle and fails what it had in flight; a live broker answers the next ask.
    KafkaError._DESTROY_BROKER,
}


def transient(error: KafkaError) -> bool:
    """Whether an error passes by itself (then ask again, for as long as the patience lasts)."""
    return error.retriable() or error.code() in _TRANSIENT
