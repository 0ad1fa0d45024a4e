"""`outbox relay` for fault tests, with an optional pause at a named point of a batch.

Usage: relay_job.py PAUSE_AT RESUME_FILE [outbox relay flags...]
PAUSE_AT is one of: none, before-produce (rows fetched, transaction not begun),
mid-transaction (half the rows produced), before-commit (all produced and
flushed, not committed), before-cleanup (committed, published rows not yet
deleted). At the first batch that reaches it the job prints "paused at X" and
waits until RESUME_FILE exists (a test kills it there, or lets it go on).
"""

import sys
import time
from pathlib import Path

from outbox.cli import main
from outbox.relay.kafka import Publisher
from outbox.relay.outbox_table import OutboxTable

pause_at, resume = sys.argv[1], Path(sys.argv[2])
paused = False


def pause(point: str) -> None:
    global paused
    if point != pause_at or paused:
        return
    paused = True
    print(f"paused at {point}", flush=True)
    while not resume.exists():
        time.sleep(0.05)


publish, produce_rows, cleanup = Publisher.publish, Publisher._produce_rows, OutboxTable.cleanup


def publish_with_pauses(self, rows, position):  # type: ignore[no-untyped-def]
    pause("before-produce")
    return publish(self, rows, position)


def produce_rows_with_pauses(self, producer, rows):  # type: ignore[no-untyped-def]
    half = len(rows) // 2
    produce_rows(self, producer, rows[:half])
    producer.poll(0.5)  # let the broker have them (flush would not add anything a test needs)
    pause("mid-transaction")
    produce_rows(self, producer, rows[half:])
    producer.poll(0.5)  # let the broker have them (flush would not add anything a test needs)
    pause("before-commit")


def cleanup_with_pauses(self, base, limit, retention):  # type: ignore[no-untyped-def]
    pause("before-cleanup")
    return cleanup(self, base, limit, retention)


Publisher.publish = publish_with_pauses  # type: ignore[method-assign]
Publisher._produce_rows = produce_rows_with_pauses  # type: ignore[method-assign]
OutboxTable.cleanup = cleanup_with_pauses  # type: ignore[method-assign]
sys.exit(main(["relay", *sys.argv[3:]]))
