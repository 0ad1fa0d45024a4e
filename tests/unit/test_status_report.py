"""`outbox status`'s figures and screen, from plain values."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from outbox.status.report import DeadLetters, LedgerPartition, RelayShard, Status, Waiting, as_json, lines

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _status() -> Status:
    relay = RelayShard(
        "billing",
        "0/2",
        True,
        "10:10:",
        NOW - timedelta(seconds=3),
        (Waiting("b", 4, NOW - timedelta(minutes=5)), Waiting("a", 1, NOW - timedelta(seconds=30))),
    )
    ledgers = (
        LedgerPartition("orders", "in", 0, 7, NOW, high_watermark=10, stable=9),
        LedgerPartition("orders", "in", 1, 12, NOW, high_watermark=10, stable=10),  # ahead: a recreated topic
        LedgerPartition("orders", "in", 2, 3, NOW),
    )
    return Status(
        "public", 6, (relay,), ledgers, (DeadLetters("sink", "orders", 2, NOW - timedelta(hours=3)),)
    )


def test_lag_is_the_high_watermark_minus_the_next_offset_and_never_negative() -> None:
    lags = [(p.lag, p.held_back) for p in _status().ledgers]
    assert lags == [(3, 1), (0, 0), (None, None)]


def test_a_shard_waits_for_the_sum_of_its_topics_and_since_its_oldest() -> None:
    [relay] = _status().relays
    assert relay.rows_waiting == 5
    assert relay.oldest() == NOW - timedelta(minutes=5)
    assert RelayShard("idle", "0/1", False, "1:1:", NOW).oldest() is None


def test_the_screen_has_a_row_per_shard_partition_and_dead_letter_table() -> None:
    screen = lines(_status(), NOW)
    rows = [line.split() for line in screen if line.startswith("  ")]
    assert ["billing", "0/2", "running", "5", "5.0", "min", "3.0", "s", "ago"] in rows
    assert ["orders", "in-0", "7", "10", "3", "1"] in [r[:6] for r in rows]
    assert ["orders", "in-2", "3", "-", "-", "-"] in [r[:6] for r in rows]
    assert ["sink", "orders", "2", "3.0", "h", "ago"] in rows
    assert "sinks: (topic ends not asked: give --bootstrap-servers)" in screen


def test_the_json_holds_the_derived_figures_and_round_trips() -> None:
    doc = json.loads(json.dumps(as_json(_status())))
    assert doc["relays"][0]["rows_waiting"] == 5
    assert doc["relays"][0]["oldest_waiting"] == (NOW - timedelta(minutes=5)).isoformat()
    assert [(p["lag"], p["beyond_lso"]) for p in doc["ledgers"]] == [(3, 1), (0, 0), (None, None)]
    assert doc["transactions"] is None
