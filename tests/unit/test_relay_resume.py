"""Where a relay session starts: each rule of resume.py, without services."""

from __future__ import annotations

import pytest

from outbox.core.errors import ConfigError
from outbox.relay.position import Position
from outbox.relay.resume import REBASED, Mark, resume

SYSTEM, OTHER = "7311", "9922"
REBASE = "outbox relays rebase --schema public"
NOW = 10_000  # the live database's next transaction id


def start(kafka: Position | None, mark: Mark | None, system: str = SYSTEM, horizon: int = NOW):
    return resume(kafka, mark, system, horizon, REBASE)


def test_a_relay_that_never_ran_starts_at_the_beginning() -> None:
    resumed = start(None, None)
    assert resumed.position == Position(system=SYSTEM) and resumed.warning is None


def test_a_relay_whose_first_batch_never_committed_starts_at_the_beginning_without_alarm() -> None:
    """Its mark was written, its Kafka commit failed: Kafka has no position, as it should."""
    resumed = start(None, Mark(Position().base, "900:900:", 1, SYSTEM))
    assert resumed.position == Position(system=SYSTEM) and resumed.warning is None


def test_a_durable_position_is_taken_as_kafka_has_it() -> None:
    kafka = Position("800:805:801", "900:900:", 42, mark=7, system=SYSTEM)
    for number in (7, 8):  # 8: a mark written for a delta whose Kafka commit then failed
        resumed = start(kafka, Mark("800:805:801", "900:900:", number, SYSTEM))
        assert resumed.position == kafka and resumed.warning is None


def test_a_database_that_lost_the_mark_of_the_kafka_position_is_republished_from_its_own() -> None:
    """Crash without fsync, failover to an asynchronous replica, restore: the issue's xid reuse."""
    kafka = Position("826:826:", mark=9, system=SYSTEM)
    resumed = start(kafka, Mark("700:700:", "790:791:", 6, SYSTEM), horizon=826)
    assert resumed.position == Position("700:700:", mark=9, system=SYSTEM)
    assert resumed.warning and "went back in time" in resumed.warning and "700:700:" in resumed.warning


def test_marks_written_after_a_rewind_count_on_past_the_lost_ones() -> None:
    """The new position carries Kafka's mark as the floor, so a later start cannot mistake the
    rewound database's new marks for the lost ones (outbox_table's mark = greatest(mark, floor) + 1)."""
    kafka = Position("826:826:", mark=9, system=SYSTEM)
    assert start(kafka, Mark("700:700:", "790:791:", 6, SYSTEM)).position.mark == 9


def test_another_cluster_is_refused_with_the_command_that_recovers() -> None:
    kafka = Position("826:826:", mark=9, system=SYSTEM)
    for mark in (Mark("826:826:", "826:826:", 9, SYSTEM), None):
        with pytest.raises(ConfigError) as refused:
            start(kafka, mark, system=OTHER)
        assert refused.value.code == "RELAY_POSITION_OTHER_CLUSTER"
        assert REBASE in str(refused.value)


def test_a_rebased_outbox_starts_from_the_rebase_whatever_kafka_says() -> None:
    kafka = Position("826:826:", mark=9, system=OTHER)
    resumed = start(kafka, Mark("50:50:", "50:50:", REBASED, SYSTEM))
    assert resumed.position == Position("50:50:", mark=9, system=SYSTEM)
    assert resumed.warning and "rebase" in resumed.warning


def test_a_database_with_no_mark_under_a_marked_position_republishes_everything_left() -> None:
    kafka = Position("826:826:", mark=9, system=SYSTEM)
    resumed = start(kafka, None)
    assert resumed.position == Position(mark=9, system=SYSTEM)
    assert resumed.warning and "lost this relay's marks" in resumed.warning


def test_lost_positions_topic_republishes_everything_left() -> None:
    resumed = start(None, Mark("826:826:", "826:826:", 9, SYSTEM))
    assert resumed.position == Position(system=SYSTEM)
    assert resumed.warning and "no position" in resumed.warning


def test_an_upgrade_from_before_marks_keeps_its_position() -> None:
    old = Position("826:826:", "900:900:", 5)
    assert start(old, None).position == Position("826:826:", "900:900:", 5, system=SYSTEM)


def test_a_position_beyond_the_databases_next_transaction_id_is_refused() -> None:
    old = Position("826:826:")  # no mark to compare with: only the horizon can tell
    with pytest.raises(ConfigError) as refused:
        start(old, None, horizon=300)
    assert refused.value.code == "RELAY_POSITION_AHEAD"
    assert REBASE in str(refused.value)
