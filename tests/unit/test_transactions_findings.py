"""What `outbox transactions` makes of kafka-transactions' tables."""

from __future__ import annotations

from outbox.cli.transactions import Hanging, hanging, open_on
from outbox_dev.jvm.kafka_tools import parse, table

DESCRIBED = (
    "CoordinatorId\tTransactionalId\tProducerId\tProducerEpoch\tTransactionState\tTransactionTimeoutMs\t"
    "CurrentTransactionStartTimeMs\tTransactionDurationMs\tTopicPartitions\t\n"
    "2\trelay-a\t7\t3\tOngoing\t60000\t1795449616333\t42500\torders-0,orders.eu-1,orders-2\t\n"
)


def test_open_transactions_on_the_topic_and_only_its_partitions() -> None:
    [found] = open_on("orders", table(DESCRIBED))
    assert (found.transactional_id, found.producer, found.partitions) == (
        "relay-a",
        "7/3",
        ("orders-0", "orders-2"),
    )
    assert found.seconds == 42.5 and found.coordinator == "2"
    assert found.line(60).startswith(
        "open      relay-a (producer 7/3, coordinator node 2) on orders-0, orders-2"
    )
    assert found.line(30).startswith("LONG-OPEN relay-a")
    assert open_on("orders.eu", table(DESCRIBED))[0].partitions == ("orders.eu-1",)
    assert open_on("payments", table(DESCRIBED)) == []


def test_a_hanging_transaction_comes_with_the_command_that_aborts_it() -> None:
    rows = table(
        "Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)\n"
        "orders\t1\t9\t0\t4\t1200\t1795449616333\t31\n"
    )
    [stuck] = hanging(rows)
    assert stuck == Hanging("orders", "1", "9/0", "1200", "31")
    assert stuck.line("b:9092").endswith(
        "`kafka-transactions --bootstrap-server b:9092 abort --topic orders --partition 1"
        " --start-offset 1200`"
    )


def test_console_consumer_lines() -> None:
    record = parse('Partition:2\tOffset:17\tevent_id:e-1,trace:t\tk\t{"a": "x\\ty"}')
    assert (record.partition, record.offset, record.key) == (2, 17, "k")
    assert record.headers == {"event_id": "e-1", "trace": "t"} and record.value == '{"a": "x\\ty"}'
    assert parse("Partition:0\tOffset:1\tNO_HEADERS\tnull\tnull").key is None
