"""The relay's outcome table (outbox/relay/outcomes.py), row by row; how librdkafka's errors are classed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from outbox.relay.outcomes import Action, Call, Failure, classify, outcome

R, A, N, S = Action.RETRY, Action.ABORT, Action.RENEW, Action.STAND_DOWN
F = list(Failure)  # retriable, abortable, fatal, fenced, timed out, unknown
EXPECTED = {
    # Nothing has been sent yet: initialising again is harmless; fencing means another instance.
    (Call.INIT, F[0]): R, (Call.INIT, F[1]): N, (Call.INIT, F[2]): N,
    (Call.INIT, F[3]): S, (Call.INIT, F[4]): R, (Call.INIT, F[5]): N,
    # begin is local in librdkafka: an error means the producer is broken.
    (Call.BEGIN, F[0]): N, (Call.BEGIN, F[1]): N, (Call.BEGIN, F[2]): N,
    (Call.BEGIN, F[3]): S, (Call.BEGIN, F[4]): N, (Call.BEGIN, F[5]): N,
    # Before the commit was asked for, nothing can be committed: abort (a fatal producer cannot).
    (Call.PRODUCE, F[0]): A, (Call.PRODUCE, F[1]): A, (Call.PRODUCE, F[2]): N,
    (Call.PRODUCE, F[3]): S, (Call.PRODUCE, F[4]): A, (Call.PRODUCE, F[5]): A,
    (Call.POSITION, F[0]): A, (Call.POSITION, F[1]): A, (Call.POSITION, F[2]): N,
    (Call.POSITION, F[3]): S, (Call.POSITION, F[4]): A, (Call.POSITION, F[5]): A,
    # Only an abortable answer says the commit did not happen; anything else may hide one that did.
    (Call.COMMIT, F[0]): R, (Call.COMMIT, F[1]): A, (Call.COMMIT, F[2]): N,
    (Call.COMMIT, F[3]): S, (Call.COMMIT, F[4]): R, (Call.COMMIT, F[5]): R,
    (Call.ABORT, F[0]): R, (Call.ABORT, F[1]): N, (Call.ABORT, F[2]): N,
    (Call.ABORT, F[3]): S, (Call.ABORT, F[4]): R, (Call.ABORT, F[5]): N,
}  # fmt: skip


@pytest.mark.parametrize(("call", "failure"), list(EXPECTED), ids=lambda x: x.value)
def test_each_row_of_the_table(call: Call, failure: Failure) -> None:
    assert outcome(call, failure) is EXPECTED[call, failure]


def test_an_unknown_commit_is_never_aborted() -> None:
    assert [f for f in Failure if outcome(Call.COMMIT, f) is Action.ABORT] == [Failure.ABORTABLE]


@pytest.mark.parametrize("where", ["outbox/relay/outcomes.py", "docs/relay.md"])
def test_the_docs_table_is_the_code_table(where: str) -> None:
    """The table in the module's docstring and in docs/relay.md says what the code does."""
    text = (Path(__file__).parents[2] / where).read_text()
    calls = "|".join(c.value for c in Call)
    lines = [line.strip() for line in text.splitlines() if re.match(rf"\s*\| ({calls}) +\|", line)]
    for line in lines:
        name, *cells = [c.strip() for c in line.strip("|").split("|")]
        assert [Action(c) for c in cells] == [outcome(Call(name), f) for f in Failure], line
    assert [line.split()[1] for line in lines] == [c.value for c in Call]


def error(
    code: int, *, fatal: bool = False, retriable: bool = False, txn_requires_abort: bool = False
) -> KafkaError:
    return KafkaError(code, "x", fatal=fatal, retriable=retriable, txn_requires_abort=txn_requires_abort)


@pytest.mark.parametrize(
    ("kafka_error", "failure"),
    [
        (error(KafkaError.PRODUCER_FENCED, fatal=True), Failure.FENCED),
        (error(KafkaError.INVALID_PRODUCER_EPOCH, txn_requires_abort=True), Failure.FENCED),
        (error(KafkaError._FENCED), Failure.FENCED),
        (error(KafkaError._INCONSISTENT, fatal=True), Failure.FATAL),
        (error(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True), Failure.ABORTABLE),
        (error(KafkaError._TIMED_OUT, retriable=True), Failure.TIMED_OUT),
        (error(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, retriable=True), Failure.RETRIABLE),
        (error(KafkaError._STATE), Failure.UNKNOWN),
    ],
    ids=lambda x: x.name if isinstance(x, Failure) else "",
)
def test_librdkafka_errors_are_classed_by_their_flags(kafka_error: KafkaError, failure: Failure) -> None:
    assert classify(kafka_error) is failure
