"""The demo's decisions and checks, alone: the input plan, the kill schedule and the verdict."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demos.loop import plan, traces
from demos.loop.verdict import Out, committed_events, judge, percentile
from outbox.trace.report import Position


@settings(max_examples=60, deadline=None)
@given(
    events=st.integers(1, 400),
    accounts=st.integers(1, 30),
    size=st.integers(1, 40),
    abort_rate=st.floats(0, 0.5),
    redeliver_rate=st.floats(0, 1),
    seed=st.integers(0, 2**32),
)
def test_the_plan_commits_each_event_once_with_every_account_in_sequence(
    events: int, accounts: int, size: int, abort_rate: float, redeliver_rate: float, seed: int
) -> None:
    txns = plan.transactions(
        events,
        accounts=accounts,
        size=size,
        rng=random.Random(seed),
        abort_rate=abort_rate,
        redeliver_rate=redeliver_rate,
    )
    committed = [e for t in txns if t.commit for e in t.events if not e.poison]
    poisoned = [e for t in txns for e in t.events if e.poison]
    assert len(poisoned) == 1 and all(t.commit for t in txns if poisoned[0] in t.events)
    assert poisoned[0].json()["n"] == "not-a-number"
    first = {}
    for e in committed:
        assert first.setdefault(e.event_id, e) == e, "a redelivery must be the same event"
    assert len(first) == events
    assert sum(t.redelivered for t in txns) == len(committed) - events
    # Per account, the first copies come in sequence 1, 2, 3, ... (what sum(seq) counts on).
    seqs: dict[int, list[int]] = defaultdict(list)
    seen: set[str] = set()
    for e in committed:
        if e.event_id not in seen:
            seen.add(e.event_id)
            seqs[e.account].append(e.seq)
    for account, got in seqs.items():
        assert got == list(range(1, len(got) + 1)), account
    aborted = {e.event_id for t in txns if not t.commit for e in t.events}
    assert not aborted & set(first), "an aborted event must never be committed"


def test_the_plan_has_aborts_and_redeliveries_at_its_defaults() -> None:
    txns = plan.transactions(5000, accounts=50, size=50, rng=random.Random(7))
    assert any(not t.commit for t in txns)
    assert any(t.redelivered for t in txns)


@given(
    window=st.floats(1, 1000),
    spark=st.integers(0, 10),
    relay=st.integers(0, 10),
    broker=st.integers(0, 2),
    seed=st.integers(0, 2**32),
)
def test_kills_come_in_the_window_as_many_as_asked_in_time_order(
    window: float, spark: int, relay: int, broker: int, seed: int
) -> None:
    kills = plan.kills(window, spark=spark, relay=relay, broker=broker, rng=random.Random(seed))
    assert [k.at for k in kills] == sorted(k.at for k in kills)
    assert all(0 <= k.at <= window for k in kills)
    counts = {c: sum(k.component == c for k in kills) for c in ("spark", "relay", "broker")}
    assert counts == {"spark": spark, "relay": relay, "broker": broker}
    for component, n in (("spark", spark), ("relay", relay)):
        times = [k.at for k in kills if k.component == component]
        # one kill in each of n equal slots: spread over the window, not bunched
        assert all(i * window / n <= t <= (i + 1) * window / n for i, t in enumerate(times))


def _event(event_id: str, account: int, seq: int, n: int) -> dict:
    return {"event_id": event_id, "account": account, "seq": seq, "n": n}


def _out(offset: int, e: dict, square: int | None = None, partition: int = 0) -> Out:
    doc = {**e, "square": e["n"] ** 2 if square is None else square}
    return Out(partition, offset, str(e["account"]), json.dumps(doc).encode())


A1, A2, B1 = _event("a1", 1, 1, 3), _event("a2", 1, 2, -4), _event("b1", 2, 1, 5)


def test_committed_events_counts_redeliveries_once_and_keeps_poison_apart() -> None:
    bad = {**B1, "event_id": "p", "n": "not-a-number"}
    values = [json.dumps(e).encode() for e in (A1, A2, A1, bad, B1, A2)]
    given = committed_events((0, offset, v) for offset, v in enumerate(values))
    assert set(given.events) == {"a1", "a2", "b1"} and given.copies == 2
    assert set(given.poison) == {"p"}
    assert given.at == {"a1": (0, 0), "a2": (0, 1), "p": (0, 3), "b1": (0, 4)}, "each first copy's place"


def test_the_event_traced_is_in_flight_closest_to_a_kill_else_a_restarts_first_else_the_last() -> None:
    committed_at = {"a": 1.0, "b": 3.0, "c": 2.0, "d": 5.0}
    by_place = {(0, 0): "a", (0, 1): "c", (1, 0): "b", (1, 1): "d"}
    # Applied after the kill at 4.0: c (committed 2 s before it), b (1 s) and d (after it).
    applied = {4.0: [(6.0, 0, 1), (6.5, 1, 0), (7.0, 1, 1)], 10.0: []}
    why, event = traces.choose([4.0, 10.0], committed_at, by_place, applied) or ("", "")
    assert event == "b" and why.startswith("an event in flight: committed to Kafka 1.0 s before"), why
    # The job had caught up at each kill: the first event the last restart applied.
    caught_up = {4.0: [(7.0, 1, 1), (6.0, 0, 2)], 10.0: [(12.0, 1, 1), (11.0, 0, 1), (10.5, 0, 9)]}
    why, event = traces.choose([4.0, 10.0], {**committed_at, "c": 11.0, "d": 11.5}, by_place, caught_up) or (
        "",
        "",
    )
    assert event == "c" and why.startswith("nothing was in flight"), why
    # The last kill came once all was applied: the first event applied after an earlier one.
    late = {**caught_up, 20.0: []}
    why, event = traces.choose([4.0, 10.0, 20.0], {**committed_at, "c": 11.0, "d": 11.5}, by_place, late) or (
        "",
        "",
    )
    assert event == "c" and why.startswith("nothing was in flight"), why
    # Every kill came when all was applied (the CI run of session 18 met it): the event committed last.
    why, event = traces.choose([4.0, 10.0], committed_at, by_place, {4.0: [], 10.0: []}) or ("", "")
    assert event == "d" and "every kill -9" in why, why
    assert traces.choose([], committed_at, by_place, {}) == ("an event, through the whole loop", "d")
    assert traces.choose([4.0], {}, {}, {4.0: []}) is None


PICK = traces.Pick("why", 7, Position("in", 0, 3))
APPLIED = {"outcome": "applied", "outbox": {"state": "published", "published": {"partition": 1}}}


@pytest.mark.parametrize(
    ("pick", "trace", "wrong"),
    [
        (PICK, {"records": [APPLIED], "dead_letters": []}, False),
        (PICK, {"records": [], "dead_letters": []}, True),
        (PICK, {"records": [APPLIED, APPLIED], "dead_letters": []}, True),
        (PICK, {"records": [{**APPLIED, "outcome": "duplicate"}], "dead_letters": []}, True),
        (PICK, {"records": [{**APPLIED, "outbox": {"state": "waiting"}}], "dead_letters": []}, True),
        (PICK, {"records": [{**APPLIED, "outbox": {"state": "published"}}], "dead_letters": []}, True),
        (replace(PICK, dead_lettered=True), {"records": [], "dead_letters": [{}]}, False),
        (replace(PICK, dead_lettered=True), {"records": [APPLIED], "dead_letters": [{}]}, True),
        (replace(PICK, dead_lettered=True), {"records": [], "dead_letters": []}, True),
    ],
)
def test_a_demo_trace_is_checked_for_what_its_event_must_show(
    pick: traces.Pick, trace: dict, wrong: bool
) -> None:
    assert bool(traces.check(pick, trace)) == wrong


def test_a_clean_output_passes() -> None:
    v = judge({e["event_id"]: e for e in (A1, A2, B1)}, 0, [_out(0, A1), _out(1, A2), _out(2, B1)])
    assert v.ok and (v.duplicates, v.missing, v.out_of_order, v.leaked, v.wrong) == (0, 0, 0, 0, 0)


def test_each_fault_is_caught() -> None:
    inputs = {e["event_id"]: e for e in (A1, A2, B1)}
    cases = {
        "duplicates": [_out(0, A1), _out(1, A2), _out(2, B1), _out(3, A2)],
        "missing": [_out(0, A1), _out(1, B1)],
        "out_of_order": [_out(0, A2), _out(1, A1), _out(2, B1)],
        "leaked": [_out(0, A1), _out(1, A2), _out(2, B1), _out(3, _event("x", 3, 1, 1))],
        "wrong": [_out(0, A1), _out(1, A2, square=15), _out(2, B1)],
    }
    for field, outputs in cases.items():
        v = judge(inputs, 0, outputs)
        assert getattr(v, field) == 1 and not v.ok, (field, v)
        others = {"duplicates", "missing", "out_of_order", "leaked", "wrong"} - {field}
        assert all(getattr(v, o) == 0 for o in others), (field, v)


def test_nothing_in_nothing_out_is_not_a_pass() -> None:
    assert not judge({}, 0, []).ok


def test_percentile_is_by_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50, 99, 100)
    assert percentile([7], 99) == 7 and percentile([], 50) is None


def test_bad_flags_get_one_clear_line(capsys) -> None:  # type: ignore[no-untyped-def]
    from demos.loop.__main__ import parser

    for argv, says in (
        (["--events", "0"], "--events: 0 is below 1"),
        (["--duration", "x"], "'x' is not a float"),
    ):
        with pytest.raises(SystemExit):
            parser().parse_args(argv)
        assert says in capsys.readouterr().err


def test_an_avro_input_value_reads_back_as_its_document_and_the_poison_one_as_json() -> None:
    import io

    from fastavro import parse_schema, schemaless_writer

    from demos.loop import formats
    from outbox.core.wire import frame

    doc = {"event_id": "e1", "account": 3, "seq": 9, "n": -12}
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(formats.SCHEMA), doc)
    assert formats.decode(frame(7, body.getvalue())) == doc
    poison = {**doc, "n": "not-a-number"}
    assert formats.decode(formats.json_value(poison)) == poison
