"""`outbox verify` on real topics: each check fails on a topic seeded with the fault it looks for.

The checks themselves, as plain functions, are in tests/unit/test_verify_findings.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.core.kafka import client_settings
from tests.cli import REPO, assert_one_line_error, outbox
from tests.helpers import create_topic, transactional_producer, unique


def publish(
    bootstrap: str, topic: str, events: list[tuple[str, str, object]], *, commit: bool = True
) -> None:
    """(event id, key, seq) in one transaction, the id in the event_id header, seq in the JSON value."""
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    for event_id, key, seq in events:
        value = json.dumps({"id": event_id, "seq": seq}).encode()
        producer.produce(topic, key=key.encode(), value=value, headers=[("event_id", event_id.encode())])
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def verify(bootstrap: str, topic: str, *flags: str) -> tuple[int, str]:
    result = outbox(
        "verify", topic, "--bootstrap-servers", bootstrap, "--order-field", "seq", *flags, "--json"
    )
    assert result.err == "", result.err
    return result.code, result.out


def test_a_clean_topic_passes(bootstrap: str) -> None:
    source, out = create_topic(bootstrap, unique("src"), 2), create_topic(bootstrap, unique("out"), 2)
    events = [(f"e{i}", f"k{i % 3}", i) for i in range(12)]
    publish(bootstrap, source, events)
    publish(bootstrap, out, events)
    code, text = verify(bootstrap, out, "--source-topic", source)
    assert code == 0, text
    assert json.loads(text.splitlines()[-1]) == {"topic": out, "records": 12, "ok": True, "findings": {}}


def test_a_duplicate_is_found(bootstrap: str) -> None:
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1), ("e2", "k", 2)])
    publish(bootstrap, out, [("e2", "k", 2)])  # redelivered in a later transaction
    code, text = verify(bootstrap, out)
    assert code == 1 and "duplicate: event e2 appears 2 times" in text, text


def test_a_gap_is_found(bootstrap: str) -> None:
    source, out = create_topic(bootstrap, unique("src"), 1), create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, source, [("e1", "k", 1), ("e2", "k", 2), ("e3", "k", 3)])
    publish(bootstrap, out, [("e1", "k", 1), ("e3", "k", 3)])
    code, text = verify(bootstrap, out, "--source-topic", source)
    assert code == 1 and "missing: event e2 was never published" in text, text


def test_an_out_of_order_pair_is_found(bootstrap: str) -> None:
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1), ("e2", "k", 3), ("e3", "k", 2)])
    code, text = verify(bootstrap, out)
    assert code == 1 and "out-of-order: key 'k': 2 after 3" in text, text


def test_a_record_whose_order_field_holds_no_number_is_found(bootstrap: str) -> None:
    """Left out of the order check, such records made it pass unchecked; a NaN made it crash."""
    out = create_topic(bootstrap, unique("out"), 1)
    publish(
        bootstrap,
        out,
        [("e1", "k", 1), ("e2", "k", "2024-01-02"), ("e3", "k", float("nan")), ("e4", "k", None)],
    )
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    producer.produce(out, key=b"k", value=None, headers=[("event_id", b"e5")])  # a tombstone has no fields
    producer.commit_transaction(30)
    code, text = verify(bootstrap, out)
    assert code == 1, text
    assert json.loads(text.splitlines()[-1])["findings"] == {"no-sequence": 3}, text
    assert "no-sequence: the record's order field holds no number (partition 0 offset 1)" in text, text


def test_an_aborted_record_read_uncommitted_is_found(bootstrap: str) -> None:
    """A pipeline that read its source uncommitted published an aborted event: it leaked."""
    source, out = create_topic(bootstrap, unique("src"), 1), create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, source, [("e1", "k", 1)])
    publish(bootstrap, source, [("x1", "k", 2)], commit=False)
    producer = Producer(client_settings({"bootstrap.servers": bootstrap}, "producer"))
    for event_id, seq in (("e1", 1), ("x1", 2)):
        value = json.dumps({"id": event_id, "seq": seq}).encode()
        producer.produce(out, key=b"k", value=value, headers=[("event_id", event_id.encode())])
    producer.flush(30)
    code, text = verify(bootstrap, out, "--source-topic", source)
    assert code == 1 and "leaked: event x1 is not in the source" in text, text
    # Ids can come from a value field too, and the check can start at given offsets.
    code, text = verify(bootstrap, out, "--id-field", "id", "--from-offsets", '{"0": 1}')
    assert code == 0 and '"records": 1' in text, text


@pytest.mark.parametrize(
    ("offsets", "said"),
    [
        ('{"0": -1}', "no number below 0"),  # -1 is librdkafka's "the end": nothing would be checked
        ('{"3": 0}', "no partition 3"),
        ('{"0": 9}', "partition 0 ends at offset 3"),
        ('{"0": 0}', "offset 0 of partition 0 is gone"),  # deleted below: the log starts at 1
    ],
)
def test_a_start_the_topic_does_not_have_is_refused_not_skipped(
    bootstrap: str, offsets: str, said: str
) -> None:
    """Each of these passed with nothing checked: the partition skipped, or the read moved to its end."""
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1), ("e2", "k", 2)])  # offsets 0, 1; the commit marker 2
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(out, 0, 1)])[TopicPartition(out, 0, 1)].result(30)
    result = outbox("verify", out, "--bootstrap-servers", bootstrap, "--from-offsets", offsets)
    assert_one_line_error(result, said)


def test_the_source_can_be_a_query(bootstrap: str, database, pg) -> None:  # type: ignore[no-untyped-def]
    pg.execute("CREATE TABLE applied (event_id text); INSERT INTO applied VALUES ('e1'), ('e2')")
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1)])
    sql = "SELECT event_id FROM applied"
    code, text = verify(bootstrap, out, "--source-sql", sql, "--url", database.raw)
    assert code == 1 and "missing: event e2 was never published" in text, text


def test_source_events_without_an_id_are_said_not_passed_over(bootstrap: str, database, pg) -> None:  # type: ignore[no-untyped-def]
    """A source event with no id (a header left off, a NULL in the query) was dropped from what must
    appear: the event could be missing from the topic, and verify said "no findings"."""
    source, out = create_topic(bootstrap, unique("src"), 1), create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, source, [("e1", "k", 1)])
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    producer.produce(source, key=b"k", value=json.dumps({"seq": 2}).encode())  # no event_id header
    producer.commit_transaction(30)
    publish(bootstrap, out, [("e1", "k", 1)])
    code, text = verify(bootstrap, out, "--source-topic", source)
    assert code == 1 and "source-no-id: 1 source event has no id" in text, text
    pg.execute("CREATE TABLE applied (event_id text); INSERT INTO applied VALUES ('e1'), (NULL)")
    code, text = verify(bootstrap, out, "--source-sql", "SELECT event_id FROM applied", "--url", database.raw)
    assert code == 1 and "source-no-id: 1 source event has no id" in text, text


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        # An empty flag (an unset shell variable) skipped the check of missing and leaked events.
        (["--source-topic", ""], "--source-topic is empty"),
        (["--source-sql", ""], "--source-sql is empty"),
        (["--order-field", ""], "--order-field is empty"),  # skipped the order check: exit 0
        (["--id-field", ""], "--id-field is empty"),
        # The source is read whole, the topic from these offsets: what came before was "missing".
        (["--from-offsets", '{"0": 1}', "--source-topic", "t"], "--from-offsets"),
        (["--from-offsets", '{"0": 1e400}'], "no number below 0"),  # a traceback (OverflowError)
        (["--from-offsets", '{"0": Infinity}'], "no number below 0"),
    ],
)
def test_flags_that_checked_nothing_or_failed_with_a_traceback_are_one_line(
    bootstrap: str, flags: list[str], said: str
) -> None:
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1), ("e2", "k", 2)])
    result = outbox("verify", out, "--bootstrap-servers", bootstrap, *flags)
    assert_one_line_error(result, said)


def test_a_source_query_with_no_column_is_one_line(bootstrap: str, database) -> None:  # type: ignore[no-untyped-def]
    out = create_topic(bootstrap, unique("out"), 1)
    result = outbox(
        "verify", out, "--bootstrap-servers", bootstrap, "--source-sql", "SELECT", "--url", database.raw
    )
    assert_one_line_error(result, "--source-sql", "no column")


@pytest.mark.parametrize(
    "command", [["verify", "t"], ["trace", "00000000-0000-0000-0000-000000000000"], ["status"]]
)
@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "inf"])
def test_a_timeout_that_is_no_positive_number_of_seconds_is_refused(command: list[str], seconds: str) -> None:
    """A negative or NaN timeout waited forever on a broker that is down; status failed with a traceback."""
    result = outbox(*command, "--timeout", seconds)
    assert result.code == 2 and "Traceback" not in result.err, result
    assert f"--timeout: {seconds!r} is not a positive number of seconds" in result.err, result.err


def test_a_source_that_is_the_topic_checked_is_refused(bootstrap: str) -> None:
    """The expected events read from the topic checked: none could ever be missing."""
    out = create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, out, [("e1", "k", 1)])
    result = outbox("verify", out, "--bootstrap-servers", bootstrap, "--source-topic", out)
    assert_one_line_error(result, "--source-topic names the topic checked")


def test_output_cut_short_by_its_reader_is_no_pass(bootstrap: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`outbox verify ... | head`: the reader closed the pipe before the findings and the summary
    were written, and the exit status said "ok" (0), under `set -o pipefail` too."""
    source, out = create_topic(bootstrap, unique("src"), 1), create_topic(bootstrap, unique("out"), 1)
    publish(bootstrap, source, [(f"event-{i:05}", "k", i) for i in range(4000)])  # 4,000 lines missing
    publish(bootstrap, out, [("event-00000", "k", 0)])
    line = f"{sys.executable} -m outbox verify {out} --bootstrap-servers {bootstrap} --source-topic {source}"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line} | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.startswith("missing"), done
    assert done.returncode == 141, done  # 128 + SIGPIPE, as a tool killed by the closed pipe
