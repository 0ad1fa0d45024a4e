"""Named points of a batch where a fault test may hold the relay, to kill it -9 right there.

The relay takes a `Pause` (a function of the point's name) and calls it at
each point; in production it takes none, and the points cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable

Pause = Callable[[str], None]

BEFORE_PRODUCE = "before-produce"  # rows fetched, Kafka transaction not begun
MID_TRANSACTION = "mid-transaction"  # half the rows produced
BEFORE_POSITION = "before-position"  # every row produced, the position not yet
BEFORE_COMMIT = "before-commit"  # every record and the position produced, not committed
BEFORE_CLEANUP = "before-cleanup"  # committed; the published rows not yet deleted
POINTS = (BEFORE_PRODUCE, MID_TRANSACTION, BEFORE_POSITION, BEFORE_COMMIT, BEFORE_CLEANUP)
