"""Deleting published rows beside the publishing loop, on a session of its own.

A DELETE of a second's worth of rows takes tens of milliseconds at 10k events/s;
run between two batches, every event committed meanwhile waited for it. Here
the loop only hands over, about once a second, the base of a position it has
published (`published`), and never waits. Only rows visible in a base already
committed to Kafka are deleted, so a cleaner that lags, or outlives its session
by a moment, deletes nothing unpublished; which rows other relays still need,
the DELETE itself checks (OutboxTable.cleanup).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from outbox.relay.metrics import RelayMetrics
from outbox.relay.outbox_table import OutboxTable, opened
from outbox.relay.pause import BEFORE_CLEANUP, Pause

ROUND = 1.0  # seconds between rounds, unless the last one left rows to delete
JOIN = 1.0  # seconds a session's end waits for its cleaner; one stuck in a query ends by its timeout


class Cleaner:
    """One session's cleaner: deletes what the latest base handed to it has published.

    Its first error ends it; the publishing loop raises that error at its next
    batch (`check`), so an outage ends the session along one path, with one line.
    """

    def __init__(
        self,
        table: Callable[[], OutboxTable],
        metrics: RelayMetrics,
        *,
        batch: int,
        retention: float,
        pause: Pause | None = None,
    ) -> None:
        self._table, self._metrics, self._pause = table, metrics, pause
        self._batch, self._retention = batch, retention
        self._base: str | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="outbox-relay-cleanup", daemon=True)

    def __enter__(self) -> Cleaner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(JOIN)

    def published(self, base: str) -> None:
        """Everything visible in `base` is committed to Kafka."""
        self._base = base

    def check(self) -> None:
        """Raise the error that ended the cleaner, if one did."""
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            with opened(self._table(), listen=False) as table:
                self._rounds(table)
        except BaseException as exc:  # handed to the publishing loop, which raises it
            self.error = exc

    def _rounds(self, table: OutboxTable) -> None:
        more = False
        while True:
            if not more:
                self._stop.wait(ROUND)
            if self._stop.is_set():
                return
            base, more = self._base, False
            if base is None:
                continue
            if self._pause is not None:
                self._pause(BEFORE_CLEANUP)
            with self._metrics.cleanup_seconds.time():
                deleted = table.cleanup(base, self._batch, self._retention)
            self._metrics.cleaned.inc(deleted)
            more = deleted == self._batch  # more to delete: at once, not in a second
