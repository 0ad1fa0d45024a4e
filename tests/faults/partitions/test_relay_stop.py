"""A stop with a bound: SIGTERM while a batch crawls over a slow link to Kafka ends the relay
within --stop-timeout, its transaction left open; a second signal ends it at once. Either way the
next relay publishes every row once, as both readers and `outbox verify` find."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from outbox.core.config import DatabaseUrl
from outbox.relay.pause import MID_TRANSACTION
from outbox.stopping import PASSED_BOUND
from tests.faults.partitions.links import PARTITIONS, Proxied, proxied_relay
from tests.helpers import create_topic, unique
from tests.relay_support import ACTIVE, Writers, check_two_readers, terminate


@pytest.mark.parametrize("second_signal", [False, True], ids=["bound-passed", "second-sigterm"])
def test_a_stop_mid_batch_over_a_slow_link_is_bounded_and_loses_nothing(
    tmp_path: Path, db: Proxied, kafka: Proxied, second_signal: bool
) -> None:
    url = DatabaseUrl.parse(db.direct)
    topic = create_topic(kafka.direct, unique("stop"), partitions=PARTITIONS)
    writers = Writers(url, topic).start(transactions=80)  # some 640 rows: one batch of 500
    writers.join()
    # With a bound of 600 s, only the second signal can end the relay before the test's wait.
    bound = "600" if second_signal else "2"
    name = unique("relay")
    flags = ("--batch-size", "500", "--stop-timeout", bound)
    job, resume = proxied_relay(tmp_path, db, kafka, name, *flags, pause_at=MID_TRANSACTION)
    job.wait_for_output(f"paused at {MID_TRANSACTION}", 60)
    for link in kafka.links:  # 8 kB/s toward Kafka: the rest of the batch takes some 10 s
        link.add("bandwidth", "upstream", rate=8)
    os.kill(job.process.pid, signal.SIGTERM)  # asked to stop with the batch in flight
    resume.touch()
    job.wait_for_output("SIGTERM: stopping once the work in flight ends", 30)
    if second_signal:  # once the first was taken: two at once may arrive as one
        os.kill(job.process.pid, signal.SIGTERM)
        assert job.wait(120) == 128 + signal.SIGTERM, job.output()[-3000:]
        assert "SIGTERM again: exiting at once" in job.output()
    else:
        assert job.wait(120) == PASSED_BOUND, job.output()[-3000:]
        assert "did not end within the stop bound of 2s" in job.output(), job.output()[-3000:]
    kafka.heal()
    after, _ = proxied_relay(tmp_path, db, kafka, name)
    after.wait_for_output(ACTIVE, 60)
    check_two_readers(kafka.direct, topic, PARTITIONS, writers.committed, url)
    assert terminate(after) == 0
