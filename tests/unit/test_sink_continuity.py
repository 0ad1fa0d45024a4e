"""The rule that tells a database which lost a sink's batches from one that holds them all."""

from __future__ import annotations

from sinks.postgres.continuity import LastBatch, behind, lost, lost_batches


def test_the_batch_before_or_a_replay_of_this_one_is_whole() -> None:
    assert not lost(LastBatch("q", 6), "q", 7)
    assert not lost(LastBatch("q", 7), "q", 7)  # batch 7 replayed after a crash


def test_an_older_batch_of_the_same_query_means_the_ones_between_are_gone() -> None:
    assert lost(LastBatch("q", 4), "q", 7) == range(5, 7)


def test_nothing_to_compare_for_a_new_query_a_first_batch_or_no_query() -> None:
    assert not lost(LastBatch("old", 40), "new", 3)  # a new checkpoint counts from 0 again
    assert not lost(None, "q", 9)
    assert not lost(LastBatch("q", 1), None, 9)  # not a streaming batch


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
