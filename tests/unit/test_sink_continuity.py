"""The rule that tells a database which lost a sink's batches from one that holds them all."""

from __future__ import annotations

from sinks.postgres.continuity import behind, lost, lost_batches


def test_the_batch_before_or_a_replay_of_this_one_is_whole() -> None:
    assert not lost(6, "q", 7)
    assert not lost(7, "q", 7)  # batch 7 replayed after a crash
    assert not lost(None, "q", 0)  # a new query's first batch


def test_an_older_batch_of_the_query_means_the_ones_between_are_gone() -> None:
    assert lost(4, "q", 7) == range(5, 7)


def test_a_query_past_its_first_batch_with_none_recorded_lost_them_all() -> None:
    """Whatever another query recorded: a restore that brought an old query's record back took this
    one's batches away (issue 60)."""
    assert lost(None, "new", 3) == range(0, 3)


def test_nothing_to_compare_outside_a_streaming_query() -> None:
    assert not lost(None, None, 9)
    assert not lost(1, None, 9)


def test_the_error_names_the_batches_and_the_offsets_to_start_from() -> None:
    lost_error = lost_batches("orders", range(5, 7), 7, {("t", 1): 20, ("t", 0): 10, ("u", 0): 3})
    assert lost_error.code == "SINK_BATCH_LOST"
    error = lost_error.message
    assert "sink orders: PostgreSQL no longer holds batches 5-6," in error
    assert "nothing of batch 7 was applied" in error
    assert """startingOffsets='{"t":{"0":10,"1":20},"u":{"0":3}}'""" in error
    assert "ledger.sink=orders" in error


def test_a_task_commit_the_ledger_no_longer_shows_is_named() -> None:
    ends = {("t", 0): 200, ("t", 1): 190, ("u", 0): 5}
    assert behind({("t", 0): 200, ("t", 1): 400, ("u", 0): 5}, ends) == []  # ahead: a later replay
    assert behind({("t", 1): 190, ("u", 0): 4}, ends) == [("t", 0), ("u", 0)]


def test_a_query_with_no_batch_recorded_is_told_how_to_adopt_a_moved_checkpoint() -> None:
    error = lost_batches("orders", range(0, 3), 3, {("t", 0): 10}, unknown="q-1").message
    assert "PostgreSQL no longer holds batches 0-2 of this query, which it holds no batch of," in error
    assert error.endswith("record it instead: outbox sinks adopt orders --query q-1 --batch 2")
    assert "outbox sinks adopt" not in lost_batches("orders", range(5, 7), 7, {}).message
