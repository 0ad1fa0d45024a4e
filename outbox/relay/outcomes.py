"""The relay's outcome table: what it does when a transactional call fails, by call and error class.

One rule above all: a commit whose outcome is unknown is never treated as an
abort. The relay asks again until the answer is known, or drops the producer;
a new producer's `init_transactions` fences the old epoch (a late request of
the old producer, the delayed EndTxn of KAFKA-17754, is refused) and settles
the open transaction one way or the other. Whatever ends a transaction
without a commit, the relay then reads its position back from Kafka, with
read_committed, before it publishes again: Kafka, not memory, says what was
published.

| call \\ error | retriable | abortable | fatal | fenced | timed out | unknown |
|---|---|---|---|---|---|---|
| init      | retry | renew | renew | stand down | retry | renew |
| begin     | renew | renew | renew | stand down | renew | renew |
| produce   | abort | abort | renew | stand down | abort | abort |
| position  | abort | abort | renew | stand down | abort | abort |
| commit    | retry | abort | renew | stand down | retry | retry |
| abort     | retry | renew | renew | stand down | retry | renew |

retry: the same call again on the same producer, for up to the call's budget;
then renew. abort: the outcome is known, nothing was committed: abort, then
renew. renew: no abort; a new producer, then the position read back. stand
down: another instance owns the transactional id; end the session (the run
loop starts a new one after a pause, and PostgreSQL's lock says who is
active).
"""

from __future__ import annotations

from enum import Enum

from confluent_kafka import KafkaError


class Call(Enum):
    INIT = "init"
    BEGIN = "begin"
    PRODUCE = "produce"
    POSITION = "position"  # producing the position record into the transaction
    COMMIT = "commit"
    ABORT = "abort"


class Failure(Enum):
    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    FENCED = "fenced"
    TIMED_OUT = "timed out"
    UNKNOWN = "unknown"


class Action(Enum):
    RETRY = "retry"
    ABORT = "abort"
    RENEW = "renew"
    STAND_DOWN = "stand down"


FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
TIMED_OUT_CODES = frozenset({KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT})


def classify(error: KafkaError) -> Failure:
    """librdkafka's own flags first: fencing and fatal errors end the producer whatever else is set."""
    if error.code() in FENCED_CODES:
        return Failure.FENCED
    if error.fatal():
        return Failure.FATAL
    if error.txn_requires_abort():
        return Failure.ABORTABLE
    if error.code() in TIMED_OUT_CODES:
        return Failure.TIMED_OUT
    if error.retriable():
        return Failure.RETRIABLE
    return Failure.UNKNOWN


R, A, N, S = Action.RETRY, Action.ABORT, Action.RENEW, Action.STAND_DOWN
COLUMNS = tuple(Failure)  # retriable, abortable, fatal, fenced, timed out, unknown
# The docstring's table, row for row. Only an abortable error says a commit did not happen.
ROWS: dict[Call, tuple[Action, ...]] = {
    Call.INIT: (R, N, N, S, R, N),
    Call.BEGIN: (N, N, N, S, N, N),
    Call.PRODUCE: (A, A, N, S, A, A),
    Call.POSITION: (A, A, N, S, A, A),
    Call.COMMIT: (R, A, N, S, R, R),
    Call.ABORT: (R, N, N, S, R, N),
}


def outcome(call: Call, failure: Failure) -> Action:
    return ROWS[call][COLUMNS.index(failure)]
