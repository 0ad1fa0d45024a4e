"""A trace's outcomes, decided from trace rows: written, deleted, stale or duplicate."""

from __future__ import annotations

from datetime import UTC, datetime

from outbox.trace.outcomes import TraceRow, records

AT = datetime(2026, 11, 25, tzinfo=UTC)
A, B = "a", "b"


def _row(events, versions, written=(), deletes=(), removed=(), offsets=None):  # type: ignore[no-untyped-def]
    offsets = offsets or list(range(len(events)))
    n = len(events)
    return TraceRow(
        "s", "7", 0, AT, None, ["t"] * n, [0] * n, offsets, events, versions, written, deletes, removed
    )


def test_written_is_applied_and_a_lower_version_after_it_is_stale() -> None:
    rows = [
        _row([A, B], ["10", "1"], written=[A, B]),
        _row([A, B], ["9", "1"], offsets=[2, 3]),
        _row([A], ["11"], deletes=[A], removed=[A], offsets=[4]),
        _row([A], ["3"], deletes=[A], offsets=[5]),  # a delete of a row that is gone
    ]
    assert [(r.offset, r.outcome) for r in records(rows)] == [
        (0, "applied"),
        (1, "applied"),
        (2, "stale"),  # 9 < 10 as numbers, though not as text
        (3, "duplicate"),
        (4, "deleted"),
        (5, "duplicate"),
    ]


def test_only_the_wanted_events_and_in_partition_offset_order() -> None:
    row = TraceRow(
        "s", "7", 0, AT, "out", ["t", "t", "t"], [1, 0, 0], [5, 9, 2], [A, A, B], None, [A], [], []
    )
    found = records([row], {A})
    assert [(r.partition, r.offset, r.outcome, r.wrote_outbox) for r in found] == [
        (0, 9, "applied", True),
        (1, 5, "applied", True),
    ]


def test_versions_that_are_not_numbers_compare_as_text_and_unversioned_skips_are_duplicates() -> None:
    rows = [
        _row([A], ["2026-11-25T10:00:00"], written=[A]),
        _row([A], ["2026-11-24T23:00:00"], offsets=[1]),
        _row([A], [None], offsets=[2]),
        _row([B], None, offsets=[3]),
    ]
    assert [r.outcome for r in records(rows)] == ["applied", "stale", "duplicate", "duplicate"]


def test_no_written_list_means_every_upsert_was_written() -> None:
    row = _row([A, B, "c"], None, written=None, deletes=["c"], removed=[])
    assert [r.outcome for r in records([row])] == ["applied", "applied", "duplicate"]
