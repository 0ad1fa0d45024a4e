"""A transaction left open: `outbox transactions TOPIC` names it, and kafka_rc shows what it holds back."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

from tests.cli import outbox
from tests.helpers import Job, create_topic, unique, wait_for
from tests.source_support import stream_to_memory

STUCK = """
import sys, time
from confluent_kafka import Producer
bootstrap, topic, tid = sys.argv[1:4]
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "transaction.timeout.ms": 40000})
p.init_transactions(30)
p.begin_transaction()
p.produce(topic, key=b"k", value=b"v", partition=1)
p.flush(30)
print("open", flush=True)
time.sleep(3600)
"""


def test_a_producer_stopped_mid_transaction_is_named_until_its_transaction_times_out(  # type: ignore[no-untyped-def]
    spark, bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("held"), partitions=2)
    tid = f"stuck-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    producer = Job([str(script), bootstrap, topic, tid], tmp_path / "stuck.log", {})
    try:
        producer.wait_for_output("open", 60)
        os.kill(producer.process.pid, signal.SIGSTOP)  # alive, silent: its transaction stays open

        def listed() -> str:
            result = outbox("transactions", topic, "--bootstrap-servers", bootstrap, "--older-than", "1")
            assert result.code in (0, 1), result
            return result.out

        out = listed()
        assert out.startswith(f"LONG-OPEN {tid} (producer "), out
        assert f"on {topic}-1, open" in out
        assert out.splitlines()[-1] == f"{topic}: 1 open transaction(s), 1 open 1 s or longer, 0 hanging"

        # kafka_rc's progress shows the record the open transaction holds back on partition 1.
        query, _ = stream_to_memory(
            spark, bootstrap, topic, tmp_path / "chk", available_now=False, stallWarnMs="1000"
        )
        try:
            wait_for(lambda: query.lastProgress is not None, 60, "a progress report")
            latest = query.lastProgress["sources"][0]["latestOffset"]
            assert '"#uncommitted": {"' + topic + '": {"1": 1}}' in latest, latest
        finally:
            query.stop()
    finally:
        producer.kill9()
    # Its coordinator aborts it at its transaction.timeout.ms (40 s: room for the listing and a
    # stream's first progress, above, on a busy machine): nothing is left open.
    wait_for(
        lambda: listed().endswith(f"{topic}: 0 open transaction(s), 0 open 1 s or longer, 0 hanging\n"),
        120,
        "the abort",
    )
