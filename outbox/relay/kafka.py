"""The Kafka edge of the relay: one transaction per batch holding the records and the position.

As in Kafka Connect's exactly-once source connectors (KIP-618), the position
is written to a compacted topic inside the same transaction as the records
it covers, so both are committed or neither is. At start the position is
read back with read_committed after `init_transactions`, which fences any
older instance with the same transactional.id and aborts its open
transaction: whatever is read then is the truth.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
)
from confluent_kafka.admin import AclOperation, AdminClient, ConfigResource

from outbox.core.errors import OutboxError
from outbox.core.kafka import client_settings
from outbox.core.tables import EVENT_ID_HEADER
from outbox.errors import error
from outbox.relay.acls import Access
from outbox.relay.outcomes import FENCED_CODES, Action, Call, classify, outcome
from outbox.relay.pause import BEFORE_COMMIT, BEFORE_POSITION, BEFORE_PRODUCE, MID_TRANSACTION, Pause
from outbox.relay.poison import (
    TOPIC_CODES,
    Poison,
    explain,
    is_poison,
    missing_topic,
    record_size,
    reported,
    unpublishable,
)
from outbox.relay.position import Identity, Position
from outbox.relay.positions import PositionStore, answer
from outbox.relay.row import Row
from outbox.relay.topics import risks

log = logging.getLogger("outbox.relay")


# Settings the relay owns; a -X override of these would void its guarantees.
RESERVED = frozenset({"transactional.id", "enable.idempotence", "bootstrap.servers"})
PRODUCER_DEFAULTS: Mapping[str, object] = {
    "partitioner": "murmur2_random",  # the Java client's partitioner: same key, same partition
    "allow.auto.create.topics": False,  # a missing topic is a poison row, not a new 1-partition topic
    "linger.ms": 5,
    "transaction.timeout.ms": 60000,
    # Only failures need a report (to name a poison row); a Python callback per
    # delivered record would cost as much as a third of the producer's throughput.
    "delivery.report.only.error": True,
}
# Errors that mean "the cluster cannot be reached" and leave the real cause in the client's log.
_UNREACHABLE = frozenset(
    {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE}
)
# Errors no retry clears: the broker refuses a setting of the relay's, which the operator must change.
_REFUSED_SETTINGS = {KafkaError.INVALID_TRANSACTION_TIMEOUT: "transaction.timeout.ms"}


def kafka_failure(exc: KafkaException, bootstrap: str = "", cause: str | None = None) -> OutboxError:
    """One line for a failed Kafka call: fenced, unreachable (with the cause the client saw), or other.

    A ServiceUnavailable, which the relay retries: Fenced (RELAY_FENCED), or RELAY_KAFKA_UNREACHABLE,
    or RELAY_KAFKA_FAILED; or a ConfigError that stops it, RELAY_KAFKA_SETTING_REFUSED."""
    failure = exc.args[0]
    if not isinstance(failure, KafkaError):
        return error("RELAY_KAFKA_FAILED", bootstrap=bootstrap, reason=failure)
    if failure.code() in _REFUSED_SETTINGS:
        setting = _REFUSED_SETTINGS[failure.code()]
        return error(
            "RELAY_KAFKA_SETTING_REFUSED", bootstrap=bootstrap, setting=setting, reason=failure.str()
        )
    if failure.code() in FENCED_CODES:
        return error("RELAY_FENCED")
    if failure.code() in _UNREACHABLE and cause:
        return error("RELAY_KAFKA_UNREACHABLE", bootstrap=bootstrap, cause=cause)
    return error("RELAY_KAFKA_FAILED", bootstrap=bootstrap, reason=failure.str())


class Publisher:
    """Publishes batches of outbox rows for one relay shard; exactly once, or at least once."""

    def __init__(
        self,
        bootstrap: str,
        kafka: Mapping[str, object],
        relay: Identity,
        positions_topic: str,
        *,
        exactly_once: bool = True,
        timeout: float = 30.0,
        pause: Pause | None = None,
        id_header: str = EVENT_ID_HEADER,
    ) -> None:
        clash = sorted(RESERVED & set(kafka))
        if clash:
            raise error("RELAY_KAFKA_SETTING_RESERVED", setting=clash[0])
        self.bootstrap, self.relay = bootstrap, relay
        self.exactly_once, self.timeout, self.pause = exactly_once, timeout, pause
        self.id_header = id_header
        self.retry_for = 2 * timeout  # how long a call the outcome table retries is asked again
        self.settings = {**PRODUCER_DEFAULTS, **kafka}
        self.access = Access.of(bootstrap, relay.name, positions_topic, self.settings)
        self.positions = PositionStore(self.access, self.settings, timeout)
        self._producer: Producer | None = None
        self._known_topics: set[str] = set()
        self._vetted: set[str] = set()  # events topics whose settings were looked at (`_warn_of_risks`)
        self._failures: list[tuple[KafkaError, Message]] = []
        self._cause: str | None = None  # the client's last connection error: why a call timed out
        self.commit_seconds = 0.0  # how long the last published batch's commit (or flush) took

    @property
    def window(self) -> float:
        """Seconds a batch has to reach Kafka: the least of its records' timeout (0: none), its
        transaction's (the coordinator aborts it then), and how long its commit is asked (at least
        once: its flush waits)."""
        limits = [self.retry_for if self.exactly_once else self.timeout]
        for key in ("message.timeout.ms", "delivery.timeout.ms", "transaction.timeout.ms"):
            ms = float(self.settings.get(key, 0))  # type: ignore[arg-type]  # a number, or its text from -X
            if ms > 0 and (self.exactly_once or key != "transaction.timeout.ms"):
                limits.append(ms / 1000)
        return min(limits)

    # -- start ---------------------------------------------------------------

    def start(self) -> None:
        """A producer whose init_transactions fences older instances and aborts their open transaction."""
        config = {**self.settings, "enable.idempotence": True}
        if self.exactly_once:
            config["transactional.id"] = self.relay.transactional_id
        # With an error_cb, librdkafka's errors (fencing included) surface from the
        # transactional calls instead of being raised inside delivery callbacks.
        config["error_cb"] = self._client_error
        # Failed deliveries only (delivery.report.only.error), for every record: set here, not
        # passed with each produce call, which cost a fifth of the produce loop.
        config["on_delivery"] = self._delivered
        try:
            self._producer = Producer(client_settings(config, "producer", bootstrap=self.bootstrap))
        except KafkaException as exc:  # a setting the client does not take: no broker changes that
            raise error("RELAY_KAFKA_SETTING_INVALID", reason=exc.args[0].str()) from None
        try:
            # Unreachable brokers are told in seconds, not after init_transactions' full wait.
            self._producer.list_topics(timeout=min(self.timeout, 10))
            if self.exactly_once:
                producer = self._producer
                self._call(Call.INIT, lambda: producer.init_transactions(self.timeout))
        except KafkaException as exc:
            # Error callbacks run from poll: the cause arrives now (a fatal error is raised again).
            with contextlib.suppress(KafkaException):
                self._producer.poll(0)
            raise self._failure(exc) from None

    def position(self) -> Position | None:
        """This shard's last committed position (None: it never ran); call after `start` fenced the rest."""
        try:
            return self.positions.latest(self.relay)
        except KafkaException as exc:
            raise self._failure(exc) from None

    def restart(self) -> None:
        """A new producer, initialised again: after a refused record, whose sequence number the
        idempotent producer already spent, the old one would fail its next transaction."""
        self.close()
        self.start()

    # -- publish -------------------------------------------------------------

    def check_rows(self, rows: Sequence[Row]) -> None:
        """Raise Poison for the first row that cannot go out as written, or whose topic does not
        exist (checked before producing); warn of a topic that can lose what is published to it."""
        if (bad := unpublishable(rows, self.positions.topic, self.id_header)) is not None:
            raise Poison(*bad)
        topics = {row.topic for row in rows}
        if wanted := topics - self._known_topics:
            self._known_topics = set(self.producer.list_topics(timeout=self.timeout).topics)
            missing = wanted - self._known_topics
            if missing:
                row = next(r for r in rows if r.topic in missing)
                raise Poison(row.id, self._unlisted(row.topic), topic=True)
            self._refuse_unwritable(rows, self._unwritable(wanted))
        if unvetted := topics - self._vetted:
            self._warn_of_risks(unvetted)

    def _refuse_unwritable(self, rows: Sequence[Row], refused: Mapping[str, KafkaError]) -> None:
        """Raise Poison for the first row whose topic is `refused` (by `_unwritable`)."""
        row = next((r for r in rows if r.topic in refused), None)
        if row is not None:
            self._known_topics -= refused.keys()  # asked again before its rows are sent again
            raise Poison(row.id, explain(refused[row.topic], row.topic, record_size(row)), topic=True)

    def _unwritable(self, topics: Iterable[str]) -> dict[str, KafkaError]:
        """The topics the relay may not write, and why.

        A transaction holding a record it may not write fails as a whole, and
        names no topic (librdkafka purges every record of it): the topics are
        asked for the operations the relay may do on them (KIP-430), which any
        client may ask of a topic it may describe.
        """
        admin = AdminClient(client_settings(self.settings, "admin", bootstrap=self.bootstrap))
        asked = admin.describe_topics(
            TopicCollection(sorted(topics)), include_authorized_operations=True, request_timeout=self.timeout
        )
        refused: dict[str, KafkaError] = {}
        for topic, future in asked.items():
            try:
                allowed = answer(future, self.timeout).authorized_operations
            except KafkaException as exc:
                if exc.args[0].code() not in TOPIC_CODES:
                    raise
                refused[topic] = exc.args[0]  # not the relay's to see, or deleted since
                continue
            # None or empty: the broker did not say (before KIP-430, or a Kafka-compatible one).
            if allowed and AclOperation.WRITE not in allowed:
                refused[topic] = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
        return refused

    def _warn_of_risks(self, topics: Iterable[str]) -> None:
        """Name once per session each events topic whose settings can lose what the relay published
        (`risks`). A topic the relay may not describe is left unsaid; one Kafka did not answer for in
        time is asked again with the next batch."""
        admin = AdminClient(client_settings(self.settings, "admin", bootstrap=self.bootstrap))
        resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in sorted(topics)]
        for resource, future in admin.describe_configs(resources, request_timeout=self.timeout).items():
            try:
                configs = answer(future, self.timeout)
            except KafkaException as exc:
                failure = exc.args[0]
                if not (failure.retriable() or failure.code() == KafkaError._TIMED_OUT):
                    self._vetted.add(resource.name)  # refused (no DescribeConfigs grant), or gone
                continue
            self._vetted.add(resource.name)
            for risk in risks(resource.name, {name: entry.value for name, entry in configs.items()}):
                log.warning(risk)

    def _unlisted(self, topic: str) -> str:
        """Why a topic is not in the cluster's list: it does not exist, or the relay may not see it
        (Kafka lists only the topics a client may describe)."""
        found = self.producer.list_topics(topic, timeout=self.timeout).topics.get(topic)
        if found is not None and found.error is not None and found.error.code() in TOPIC_CODES:
            return explain(found.error, topic, 0)
        return missing_topic(topic)

    def publish(self, rows: Sequence[Row], position: Position) -> None:
        """Publish rows and then the position: one Kafka transaction (or, at least once, two flushes).

        A failed call is handled as the outcome table says (outcomes.py): every
        failure ends the session, after an abort only where nothing can have been
        committed; the next session's producer fences this one and reads the
        position back from Kafka.
        """
        producer = self.producer
        self._failures = []
        self._hold(BEFORE_PRODUCE)
        call = Call.BEGIN
        try:
            if self.exactly_once:
                producer.begin_transaction()
            call = Call.PRODUCE
            half = len(rows) // 2
            self._produce_rows(producer, rows[:half])
            self._hold(MID_TRANSACTION)
            self._produce_rows(producer, rows[half:])
            if not self.exactly_once:
                self._flush(producer, rows)
            self._hold(BEFORE_POSITION)
            call = Call.POSITION
            _enqueue(producer, self.positions.topic, position.to_json(self.relay), self.relay.position_key)
            self._hold(BEFORE_COMMIT)
            call = Call.COMMIT
            committing = time.perf_counter()
            if self.exactly_once:
                self._call(Call.COMMIT, lambda: producer.commit_transaction(self.timeout))
            else:
                self._flush(producer, rows)
            self.commit_seconds = time.perf_counter() - committing
        except Poison:
            self.abort()
            raise
        except KafkaException as exc:
            producer.poll(0)  # delivery reports: a refused record fails the whole transaction
            action = outcome(call, classify(exc.args[0]))
            if action is Action.ABORT:
                self.abort()
                self._raise_poison(rows)
                if exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # of which topic?
                    refused = self._unwritable({r.topic for r in rows} | {self.positions.topic})
                    self._refuse_unwritable(rows, refused)
                    if self.positions.topic not in refused:
                        # Every topic writable now: a grant given back, or a broker that had not
                        # seen it yet. Retried, as an outage.
                        raise kafka_failure(exc, self.bootstrap, self._cause) from None
            elif call is Call.COMMIT and action is Action.RETRY:
                log.warning(
                    "the commit's outcome is still unknown after %.0fs (%s): a new producer will settle it,"
                    " and the position is read back from Kafka",
                    self.retry_for,
                    exc.args[0].str(),
                )
            raise self._failure(exc) from None
        self._raise_poison(rows)

    def _failure(self, exc: KafkaException) -> OutboxError:
        """The error a failed call ends the session with: a grant Kafka's authoriser asks for, which
        no retry changes, or else what `kafka_failure` says."""
        refused = self.access.refused(exc.args[0]) if isinstance(exc.args[0], KafkaError) else None
        return refused or kafka_failure(exc, self.bootstrap, self._cause)

    def _call(self, call: Call, run: Callable[[], object]) -> None:
        """Run one transactional call, and again while the outcome table says retry, for `retry_for`."""
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                run()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if outcome(call, classify(error)) is not Action.RETRY or time.monotonic() >= deadline:
                    raise
                log.warning("%s: %s; asking again", call.value, error.str())

    def _hold(self, point: str) -> None:
        """At a fault test's pause point, once what was produced so far reached the broker, or had
        half a second to (polled, not flushed: a flush that meets a fencing error raises from inside
        its callbacks). Nothing outstanding, nothing waited for: a hook at every point costs the
        batch little, so a storm can hold one at every commit."""
        if self.pause is not None:
            deadline = time.monotonic() + 0.5
            while len(self.producer) > 0 and time.monotonic() < deadline:
                self.producer.poll(0.05)
            self.pause(point)

    def _produce_rows(self, producer: Producer, rows: Iterable[Row]) -> None:
        for row in rows:
            headers: list[tuple[str, str | bytes | None]] = [(self.id_header, row.event_id)]
            if row.header_keys:
                headers += zip(row.header_keys, row.header_values or (), strict=True)
            try:
                _enqueue(producer, row.topic, row.value, row.key, headers=headers)
            except KafkaException as exc:
                error = exc.args[0]
                if is_poison(error):
                    raise Poison(
                        row.id,
                        explain(error, row.topic, record_size(row)),
                        topic=error.code() in TOPIC_CODES,
                    ) from None
                raise

    def _flush(self, producer: Producer, rows: Sequence[Row]) -> None:
        if producer.flush(self.timeout) > 0:
            raise error("RELAY_DELIVERY_TIMEOUT", bootstrap=self.bootstrap, timeout=self.timeout)
        self._raise_poison(rows)
        if self._failures:
            raise error("RELAY_KAFKA_FAILED", bootstrap=self.bootstrap, reason=self._failures[0][0].str())

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failures.append((error, message))

    def _raise_poison(self, rows: Sequence[Row]) -> None:
        """Raise Poison for the first row the delivery reports say Kafka refused for good (`reported`)."""
        if (poison := reported(self._failures, rows)) is not None:
            raise poison

    def abort(self) -> None:
        """Abort the open transaction, if any. If that fails too, the next producer settles it."""
        if self.exactly_once and self._producer is not None:
            producer = self._producer
            try:
                self._call(Call.ABORT, lambda: producer.abort_transaction(self.timeout))
            except KafkaException as exc:
                log.debug("abort_transaction: %s", exc.args[0].str())

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise error("RELAY_PUBLISHER_NOT_STARTED")
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            try:
                self._producer.flush(min(self.timeout, 5))
            except KafkaException as exc:  # fenced or broken: nothing left worth sending
                log.debug("flush at close: %s", exc.args[0].str())
            self._producer = None

    def _client_error(self, error: KafkaError) -> None:
        if error.code() in _UNREACHABLE:
            self._cause = error.str()
        log.log(logging.ERROR if error.fatal() else logging.DEBUG, "kafka client: %s", error.str())


def _enqueue(
    producer: Producer, topic: str, value: bytes | str | None, key: bytes | str | None, **kw: Any
) -> None:
    """producer.produce, waiting while librdkafka's local queue is full for its deliveries to drain
    it: the position's record too, whose BufferError (a full queue after a batch's last row) ended
    the process with a traceback before 2026-11-28."""
    while True:
        try:
            producer.produce(topic, value, key, **kw)
            return
        except BufferError:
            producer.poll(0.05)
