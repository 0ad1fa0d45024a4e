"""The relay daemon's loop: stand by for the shard's lock, then publish batch after batch.

All I/O sits in OutboxTable (Postgres) and Publisher (Kafka); the choice of
rows and of the next position is `position.advance`. Any failure of either
service ends the session: the Kafka transaction is aborted, the lock is let
go with the connection, and a new session starts from the position committed
in Kafka, as far as the database still knows it (`resume.resume`). Never
trusting in-memory state across a failure is what keeps "commit timed out,
did it land?" from becoming a duplicate or a gap. (A refused record is no such
failure: its transaction was aborted, so Kafka stands where the loop does.)
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from outbox import debezium
from outbox.core.config import DatabaseUrl
from outbox.core.errors import NotReady, OutboxError, ServiceUnavailable, Standby
from outbox.core.postgres import reason
from outbox.errors import error
from outbox.relay import pace
from outbox.relay.cleaner import Cleaner
from outbox.relay.kafka import Publisher, kafka_failure
from outbox.relay.metrics import RelayMetrics
from outbox.relay.outbox_table import OutboxTable, opened
from outbox.relay.pause import Pause
from outbox.relay.poison import DEAD_LETTER, Poison
from outbox.relay.position import Identity, Position, Step, Target, advance, rows_before
from outbox.relay.resume import resume
from outbox.relay.row import Row
from outbox.relay.settings import RelaySettings

log = logging.getLogger("outbox.relay")


def backoff(attempt: int) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): doubling from 0.5 s to 30 s, jittered."""
    return float(min(30.0, 0.5 * 2 ** min(attempt - 1, 6)) * random.uniform(0.8, 1.2))


@dataclass
class _Loop:
    """What the publishing loop carries from one batch to the next, each step reading or moving some."""

    position: Position
    recorded: float = 0.0  # when the base was last recorded for the other relays
    one_by_one: int = 0  # rows to publish one per transaction, to find which one Kafka refuses
    before_poison: int = 0  # rows to publish as a batch of their own, before halting on a poison row
    ahead: Future[tuple[Target, list[Row], bool]] | None = None  # the next part, read meanwhile


@dataclass(frozen=True)
class _Batch:
    """One turn of the loop: the rows it publishes, the step `advance` chose, and under which limit."""

    limit: int
    step: Step
    rows: list[Row]


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        metrics: RelayMetrics | None = None,
        stop: threading.Event | None = None,
        pause: Pause | None = None,
    ) -> None:
        """pause: called at each named point of a batch (outbox.relay.pause); for fault tests."""
        self.settings = settings
        self.pause = pause
        self.metrics = metrics or RelayMetrics(settings.name, str(settings.shard))
        self.stop = stop or threading.Event()
        self._failures = 0  # sessions failed in a row (a standby's wait resets it)
        self._outage: float | None = None  # when the outage began; None while publishing
        self._ended = 0  # sessions the outage has ended
        # Topics missing or not writable, and since when a dead-letter relay waits on their rows.
        self._topic_waits: dict[str, float] = {}
        self._limit = settings.batch_size  # rows a batch may take now (pace.py); kept across sessions
        self._context = {"relay": settings.name, "shard": str(settings.shard)}
        self._adoption_checked = False

    def run(self) -> None:
        """Relay until `stop` is set; raise ServiceUnavailable after max_retries failures in a row."""
        waiting: str | None = None  # what the relay said it waits for, until a session fails or works
        waits = 0  # in a row: a wait for brokers backs off, as each try is a whole session
        while not self.stop.is_set():
            try:
                self._session()
            except (NotReady, psycopg.errors.ReadOnlySqlTransaction) as exc:
                # A failover under way, a primary whose writes are frozen (default_transaction_
                # read_only: a cutover, a disk-full guard), or brokers down while the positions topic
                # is to be made: not a failure, and not worth more than one line. The relay cannot
                # record what it publishes until it can write again.
                wanted = _awaited(exc)
                if wanted != waiting:
                    log.warning(f"waiting for {wanted}", extra={**self._context, "error": str(exc)})
                    waiting = wanted
                self._failures, waits = 0, waits + 1
                # A standby fails at connect, a cheap try; a wait for brokers makes a producer each time.
                kafka = not isinstance(exc, (Standby, psycopg.Error))
                pause = max(self.settings.poll_interval, backoff(waits) if kafka else 0)
                self.metrics.health(False, f"waiting for {wanted}: {exc}", waits=pause)
                self.stop.wait(pause)
                continue
            except psycopg.errors.InsufficientPrivilege as exc:  # a grant to make, no outage to wait out
                url = self.settings.url
                raise error("RELAY_NOT_PERMITTED", url=url.safe, reason=reason(exc, url)) from None
            except (
                ServiceUnavailable,
                psycopg.OperationalError,
                psycopg.InterfaceError,
                KafkaException,
            ) as exc:
                self._failures += 1
                why = _describe(exc, self.settings.url, self.settings.bootstrap)
                if self._failures > self.settings.max_retries:
                    raise error("RELAY_GAVE_UP", retries=self.settings.max_retries, reason=why) from None
                waiting, waits = None, 0
                delay = backoff(self._failures)
                self.metrics.health(False, f"retrying: {why}", waits=delay)
                first = self._outage is None
                if first:
                    self._outage, self._ended = time.monotonic(), 0
                self._ended += 1
                # One line an outage; its further attempts show at DEBUG and on /readyz.
                log.log(
                    logging.WARNING if first else logging.DEBUG,
                    "session ended, retrying",
                    extra={
                        **self._context,
                        "error": why,
                        "attempt": self._failures,
                        "delay_s": round(delay, 2),
                    },
                )
                self.stop.wait(delay)

    # -- one session: lock, fence, read position, publish --------------------

    def _table(self) -> OutboxTable:
        s = self.settings
        return OutboxTable(
            s.url, s.schema, s.name, s.shard, s.synchronous_commit, s.database_timeout, s.silence
        )

    def _check_adopted(self, table: OutboxTable) -> None:
        """Once a process: tables adopted from Debezium's outbox feed this one, and the relay names
        the event id's header otherwise than Debezium's EventRouter does."""
        if self._adoption_checked:
            return
        self._adoption_checked = True
        if self.settings.event_id_header != debezium.ID_HEADER and (fed := table.adopted()):
            log.warning(
                f"{', '.join(fed)} feed this outbox as Debezium's EventRouter maps them (outbox db"
                f" adopt-debezium), but the relay puts each event's id in header"
                f" {self.settings.event_id_header!r}, where the router puts it in {debezium.ID_HEADER!r}:"
                f" run it with --event-id-header {debezium.ID_HEADER} to publish the records Debezium would",
                extra=self._context,
            )

    def _session(self) -> None:
        s = self.settings
        table = self._table()
        with opened(table):
            if not self._stand_by(table):
                return
            relay = Identity(s.name, table.outbox_id(), s.shard)
            self._check_adopted(table)
            publisher = Publisher(
                s.bootstrap,
                s.kafka,
                relay,
                s.positions_topic,
                exactly_once=s.exactly_once,
                timeout=s.kafka_timeout,
                pause=self.pause,
                id_header=s.event_id_header,
            )
            self.metrics.active.set(1)
            try:
                publisher.start()
                in_kafka = publisher.position()
                mark, horizon = table.mark()
                # Kafka holds no position of a layout that has published nothing yet, or whose
                # positions topic was lost: the database's record of each shard says it too.
                if others := table.layouts():
                    raise error("RELAY_SHARD_COUNT_CHANGED", relay=s.name, count=others[-1], shard=s.shard)
                rebase = f"outbox relays rebase --schema {s.schema}"
                resumed = resume(in_kafka, mark, table.system, horizon, rebase)
                position = resumed.position
                if resumed.warning:
                    log.warning(resumed.warning, extra=self._context)
                if mark is None:  # new to the database: known to the other relays' cleanup first
                    table.register(position)
                log.info(
                    "active",
                    extra={**self._context, "position": position.base, "after_id": position.after_id},
                )
                cleaner = None
                if s.cleanup:
                    cleaner = Cleaner(
                        self._table,
                        self.metrics,
                        batch=s.cleanup_batch,
                        retention=s.retention,
                        pause=self.pause,
                    )
                with cleaner or contextlib.nullcontext():
                    self._publish(table, publisher, position, cleaner)
            finally:
                self.metrics.active.set(0)
                publisher.close()
        log.info("stopped", extra=self._context)

    def _stand_by(self, table: OutboxTable) -> bool:
        announced = False
        while not self.stop.is_set():
            if table.try_lock():
                return True
            if not announced:
                # After an outage, the holder may be this relay's own session from before it, which
                # the server has not heard end: it ends that one once silent for `silence` seconds.
                held = ""
                if self._outage is not None:
                    held = " (or this relay's own session from before the outage, which the server ends"
                    held += f" within {self.settings.silence:.0f}s)"
                log.info("standing by: another instance is active" + held, extra=self._context)
                announced = True
            self._failures = 0
            # Another instance publishes: this one is neither halted nor behind (its gauges were set
            # by its last batch, perhaps weeks ago).
            self.metrics.halted.set(0)
            self.metrics.waiting(None)
            self.metrics.health(True, "standby", waits=self.settings.poll_interval)
            self.stop.wait(self.settings.poll_interval)
        return False

    def _publish(
        self, table: OutboxTable, publisher: Publisher, position: Position, cleaner: Cleaner | None
    ) -> None:
        """Publish batch after batch until `stop` is set; a failure of either service is raised."""
        loop = _Loop(position)
        # Through a backlog, the next part is read while this one is produced and
        # committed: the read only depends on the position `advance` already chose,
        # and a part read for a batch that then fails is simply dropped (leaving the
        # `with` waits for it, so the connection is idle before it is closed). Only a
        # part of the same delta: reading a new one records its base as published, for
        # the other relays' cleanup, and this batch is not in Kafka yet.
        with ThreadPoolExecutor(1, thread_name_prefix="outbox-relay-read") as reader:
            while not self.stop.is_set():
                batch = self._next_batch(table, loop)
                step = batch.step
                if step.persist:
                    if batch.limit == self._limit and step.position.target is not None:
                        loop.ahead = reader.submit(self._fetch, table, step.position)
                    if not self._send(table, publisher, loop, batch):
                        continue  # a row refused: the loop stands at its position, as Kafka does
                self._moved_on(loop, step)
                if cleaner is not None:
                    cleaner.check()
                if time.monotonic() - loop.recorded > 1.0:
                    self._record(table, loop, cleaner)
                if step.position.target is None:  # the delta is done: wait for the next commit
                    table.wait(self.settings.poll_interval, self.stop)

    def _next_batch(self, table: OutboxTable, loop: _Loop) -> _Batch:
        """The rows read (or read ahead), and how many of them the next batch publishes."""
        t0 = time.perf_counter()
        target, rows, cut = loop.ahead.result() if loop.ahead else self._fetch(table, loop.position)
        self.metrics.steps["read"].inc(time.perf_counter() - t0)
        loop.ahead = None
        limit = 1 if loop.one_by_one else loop.before_poison or self._limit
        step = advance(loop.position, target, [r.id for r in rows], limit, cut)
        batch = rows[: step.count]
        self.metrics.waiting(min(r.created_at for r in batch) if batch else None)
        return _Batch(limit, step, batch)

    def _send(self, table: OutboxTable, publisher: Publisher, loop: _Loop, batch: _Batch) -> bool:
        """Publish the batch in one Kafka transaction; False when Kafka refused a row of it."""
        try:
            started = self._produce(publisher, batch)
        except Poison as poison:
            self._refused(table, publisher, loop, batch.rows, poison)
            return False
        self._published(publisher, batch, started)
        return True

    def _produce(self, publisher: Publisher, batch: _Batch) -> float:
        """Check the rows, then publish them; returns when publishing began. A refused row is the
        caller's to handle; any other failure paces the next batches, then ends the session."""
        started = None  # once the rows are checked: a topic list timing out is an outage
        try:
            t0 = time.perf_counter()
            publisher.check_rows(batch.rows)
            started = time.perf_counter()
            publisher.publish(batch.rows, batch.step.position)
            self.metrics.steps["check"].inc(started - t0)
        except Poison:
            raise
        except (OutboxError, KafkaException):
            if started is not None and batch.limit == self._limit:  # not one row at a time
                elapsed = time.perf_counter() - started
                self._paced(len(batch.rows), elapsed, publisher.window, failed=True)
            raise
        assert started is not None  # published
        return started

    def _published(self, publisher: Publisher, batch: _Batch, started: float) -> None:
        """Count a batch Kafka committed, and size the next ones by how long it took."""
        m = self.metrics
        elapsed = time.perf_counter() - started
        m.commit_seconds.observe(elapsed)
        m.steps["commit"].inc(publisher.commit_seconds)
        m.steps["produce"].inc(elapsed - publisher.commit_seconds)
        if batch.limit == self._limit:
            self._paced(len(batch.rows), elapsed, publisher.window, failed=False)
        m.batches.inc()
        m.published.inc(len(batch.rows))
        m.waiting(None)  # until the next read says which row waits now
        if self._topic_waits:  # a topic published to again: its next outage is waited for anew
            for back in {r.topic for r in batch.rows} & self._topic_waits.keys():
                del self._topic_waits[back]

    def _refused(
        self, table: OutboxTable, publisher: Publisher, loop: _Loop, rows: list[Row], poison: Poison
    ) -> None:
        """After Kafka refused a row of the batch: publish its rows one by one to find the row, or
        dead-letter the row, or publish the rows before it alone, or halt on it."""
        self.metrics.aborts.inc()
        _settle(loop.ahead)
        loop.ahead = None
        # The transaction is aborted: Kafka stands where `loop.position` says.
        publisher.restart()
        if poison.ambiguous:
            loop.one_by_one = len(rows)
            log.warning(
                "Kafka refused a batch as too large: publishing its rows one per"
                " transaction to find the one at fault (if every row fits, set -X"
                " batch.size below the topic's max.message.bytes)",
                extra={**self._context, "rows": len(rows), "error": poison.reason},
            )
            return
        loop.one_by_one = 0
        topic = next(r.topic for r in rows if r.id == poison.row_id)
        if self.settings.on_poison == DEAD_LETTER and not self._waits_for_topic(poison, topic):
            self._dead_letter(table, poison)
            return
        loop.before_poison = rows_before([r.id for r in rows], poison.row_id)
        if not loop.before_poison:
            self._halt(poison, topic)

    def _moved_on(self, loop: _Loop, step: Step) -> None:
        """The loop stands at the step's position: whatever outage or halt there was is over."""
        loop.position = step.position
        loop.one_by_one = max(0, loop.one_by_one - step.count)
        loop.before_poison = 0
        if self._outage is not None:
            log.info(
                "resumed after retrying",
                extra={
                    **self._context,
                    "attempts": self._ended,
                    "outage_s": round(time.monotonic() - self._outage, 1),
                },
            )
            self._outage = None
        self._failures = 0
        self.metrics.halted.set(0)
        self.metrics.health(True, "active")

    def _record(self, table: OutboxTable, loop: _Loop, cleaner: Cleaner | None) -> None:
        """Tell the other relays' cleanup, and this one's cleaner, that the loop's base is published."""
        t0 = time.perf_counter()
        _settle(loop.ahead)  # the connection must be idle; the part read stays ahead
        # On this session, not the cleaner's: the mark's transaction updates the same row.
        table.record_base(loop.position.base)
        self.metrics.steps["record"].inc(time.perf_counter() - t0)
        loop.recorded = time.monotonic()
        if cleaner is not None:
            cleaner.published(loop.position.base)

    def _paced(self, sent: int, elapsed: float, window: float, *, failed: bool) -> None:
        """The next batches' size after this one's (pace.py), said when it changes."""
        was, most = self._limit, self.settings.batch_size
        if failed:
            self._limit = pace.after_failure(was, sent, elapsed, window)
        else:
            self._limit = pace.after_success(was, most, sent, elapsed, window)
        if self._limit < was:
            log.warning(
                "a batch of %d rows failed %.0fs into the %.0fs a batch has to reach Kafka:"
                " publishing smaller batches, at most %d rows each",
                sent,
                elapsed,
                window,
                self._limit,
                extra=self._context,
            )
        elif self._limit == most > was:
            log.info("batches are back to --batch-size %d rows", most, extra=self._context)

    def _fetch(self, table: OutboxTable, position: Position) -> tuple[Target, list[Row], bool]:
        with self.metrics.fetch_seconds.time():
            return table.fetch(position, self.settings.batch_size + 1, self.settings.batch_bytes)

    def _waits_for_topic(self, poison: Poison, topic: str) -> bool:
        """Whether a dead-letter relay still waits on this row: its topic missing or not writable for
        less than `topic_wait` so far (made after its first events, or made again). Past that, each
        of the topic's rows is dead-lettered at once, until one of them is published."""
        if not poison.topic:
            return False
        since = self._topic_waits.setdefault(topic, time.monotonic())
        return time.monotonic() - since < self.settings.topic_wait

    def _dead_letter(self, table: OutboxTable, poison: Poison) -> None:
        table.dead_letter(poison.row_id, poison.reason)
        self.metrics.dead_letters.inc()
        log.warning("dead-lettered", extra={**self._context, "row_id": poison.row_id, "error": poison.reason})

    def _halt(self, poison: Poison, topic: str) -> None:
        """Wait on the poison row a batch starts with (those before it went out), then try it again."""
        s, extra = self.settings, {**self._context, "row_id": poison.row_id, "error": poison.reason}
        self.metrics.halted.set(1)
        if s.on_poison == DEAD_LETTER:  # a row waited on for its topic (_waits_for_topic)
            left = max(0.0, s.topic_wait - (time.monotonic() - self._topic_waits[topic]))
            wait = min(s.halt_wait, left)
            log.error(
                "waiting for its topic; retrying in %.0fs, dead-lettered in %.0fs", wait, left, extra=extra
            )
        else:
            wait = s.halt_wait
            log.error(
                "halted on a poison row; retrying in %.0fs (or restart with --on-poison dead-letter)",
                wait,
                extra=extra,
            )
        self.metrics.health(False, f"halted: {poison}", waits=wait)
        self.stop.wait(wait)


def _settle(read: Future[Any] | None) -> None:
    """Wait until a read ahead is done (wanted or not), so the connection is idle again."""
    if read is not None:
        wait([read])


def _awaited(exc: BaseException) -> str:
    """What a waiting relay waits for, in its one line."""
    if isinstance(exc, Standby):
        return "a primary"
    return "a writable primary" if isinstance(exc, psycopg.Error) else "Kafka's brokers"


def _describe(exc: BaseException, url: DatabaseUrl, bootstrap: str) -> str:
    """The failure in words, without its code: it goes into RELAY_GAVE_UP's message, which has its own."""
    if isinstance(exc, KafkaException):
        return kafka_failure(exc, bootstrap).message
    if isinstance(exc, psycopg.Error):
        return f"PostgreSQL at {url.safe}: {reason(exc, url)}"
    return url.scrub(exc.message if isinstance(exc, OutboxError) else str(exc))
