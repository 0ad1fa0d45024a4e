"""The relay says what is wrong: a missing grant or setting, a read-only primary, a halt, unsafe topics."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient, ConfigResource

from outbox.core.config import DatabaseUrl
from outbox.relay.outbox_table import lock_key
from outbox.relay.position import Shard
from outbox.writer import add_event
from tests.helpers import create_topic, unique, wait_for
from tests.relay_support import ACTIVE, published, relay_job, terminate


def test_a_halted_relay_that_now_stands_by_says_so_in_its_metrics(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str]
) -> None:
    """`outbox_relay_halted` and `outbox_relay_lag_seconds` were reset only by a published batch. A
    relay halted on a poison row whose session then ended, another instance taking over, went on
    saying 1 and its old lag for as long as it stood by: weeks of alerts about a relay not publishing."""
    with psycopg.connect(outbox_db.libpq) as conn:
        add_event(conn, unique("missing"), {"n": 1}, key="a")
    name = unique("relay")
    job, _ = relay_job(tmp_path, env, name, "--database-timeout", "3")
    job.wait_for_output("halted on a poison row", 60)
    served = re.search(r"/readyz url=(\S+)", job.output())
    assert served, job.output()

    def scrape(path: str) -> str:
        try:
            return urllib.request.urlopen(served[1] + path, timeout=5).read().decode()
        except urllib.error.HTTPError as answer:  # 503 while not healthy
            return answer.read().decode()

    def gauge(metric: str) -> float:
        found = re.search(rf"^{metric}{{[^}}]*}} (\S+)$", scrape("/metrics"), re.M)
        assert found, scrape("/metrics")
        return float(found[1])

    assert gauge("outbox_relay_halted") == 1 and (lag := gauge("outbox_relay_lag_seconds")) > 0
    # The row waits on, and grows older: the lag was the age the row had when the relay halted.
    time.sleep(1.5)
    assert gauge("outbox_relay_lag_seconds") >= lag + 1.5
    with psycopg.connect(outbox_db.libpq, autocommit=True) as other:
        other.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [f"outbox-relay {name}"],
        )
        other.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", [lock_key("public", name, Shard(0, 1))]
        )
        wait_for(lambda: scrape("/readyz").strip() == "standby", 60, "the relay standing by")
        assert (gauge("outbox_relay_halted"), gauge("outbox_relay_lag_seconds")) == (0, 0)
    assert terminate(job) == 0


def test_a_primary_that_turned_read_only_is_waited_for_not_a_crash(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """A write freeze (default_transaction_read_only=on: a cutover, a provider's disk-full guard)
    failed the relay's cleanup and base record with an error it did not retry: the process exited
    with a traceback, at each restart, until writes came back."""
    database = outbox_db.libpq
    with psycopg.connect(database, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    try:
        with psycopg.connect(database) as conn:
            conn.execute("SET TRANSACTION READ WRITE")  # an application still allowed to write
            first = add_event(conn, events_topic, {"n": 0}, key="a")
        job, _ = relay_job(tmp_path, env, unique("relay"))
        try:
            wait_for(lambda: "waiting for a writable primary" in job.output(), 30, "the relay to wait")
        except AssertionError:
            raise AssertionError(job.output()) from None
        time.sleep(3)
        assert job.process.poll() is None, job.output()
    finally:
        with psycopg.connect(database, autocommit=True) as admin:
            admin.execute("SET default_transaction_read_only = off")
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    with psycopg.connect(database) as conn:
        last = add_event(conn, events_topic, {"n": 1}, key="a")
    wait_for(lambda: len(published(bootstrap, events_topic, 3)) >= 2, 60, "both events")
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == [str(first), str(last)]
    assert "Traceback" not in job.output(), job.output()
    assert terminate(job) == 0


def test_a_role_without_a_privilege_the_relay_needs_stops_it_with_one_line(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """A least-privilege role that may read and publish but not delete published rows: the first
    cleanup is refused. That is no outage to retry, and no crash: one line naming what to grant."""
    role = unique("relay_role")
    with psycopg.connect(outbox_db.libpq, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        admin.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO "{role}"')
        with admin.transaction():
            add_event(admin, events_topic, {"n": 1}, key="a")
    url = outbox_db.raw.replace("postgres@", f"{role}@", 1)
    job, _ = relay_job(tmp_path, {**env, "DATABASE_URL": url}, unique("relay"))
    assert job.wait(60) == 2, job.output()
    lines = [line for line in job.output().splitlines() if "RELAY_NOT_PERMITTED" in line]
    assert len(lines) == 1 and "permission denied for table outbox_events" in lines[0], job.output()
    assert role in lines[0], job.output()
    assert "Traceback" not in job.output(), job.output()


def test_a_kafka_setting_the_client_does_not_take_stops_the_relay_with_one_line(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A typo in -X (or a Java-only setting from a Connect worker's file) is no outage: no broker
    will ever take it, so retrying it for minutes with /readyz saying "retrying" misleads."""
    job, _ = relay_job(tmp_path, env, unique("relay"), "-X", "batch.num.messages=many")
    assert job.wait(60) == 2, job.output()
    lines = [line for line in job.output().splitlines() if "RELAY_KAFKA_SETTING_INVALID" in line]
    assert len(lines) == 1 and "batch.num.messages" in lines[0], job.output()
    assert "retrying" not in job.output(), job.output()
    # In JSON logs the reason is a log line too, for pipelines that read nothing else.
    job, _ = relay_job(
        tmp_path, env, unique("relay"), "-X", "batch.num.messages=many", "--log-format", "json"
    )
    assert job.wait(60) == 2, job.output()
    logged = [json.loads(line) for line in job.output().splitlines() if line.startswith("{")]
    assert [r["code"] for r in logged if r.get("level") == "critical"] == ["RELAY_KAFKA_SETTING_INVALID"], (
        logged
    )


def test_the_positions_topic_is_made_compacted_and_an_uncompacted_one_is_named(
    tmp_path: Path, env: dict[str, str], bootstrap: str
) -> None:
    """Made compacted and never electing an out-of-sync leader, whatever the cluster's default; an
    existing one that does either is named at the start."""
    unclean = {"cleanup.policy": "delete", "unclean.leader.election.enable": "true"}
    made, given = (unique("positions"), create_topic(bootstrap, unique("positions"), config=unclean))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in (made, given):
        job, _ = relay_job(tmp_path, env, unique("relay"), "--positions-topic", topic)
        job.wait_for_output(ACTIVE, 60)
        assert terminate(job) == 0
    resource = ConfigResource(ConfigResource.Type.TOPIC, made)
    config = admin.describe_configs([resource])[resource].result(30)
    assert config["cleanup.policy"].value == "compact" and config["min.insync.replicas"].value == "1"
    # Kafka never compacts a log's open segment, which by default stays open for 1 GiB or 7 days:
    # millions of position records, each read into memory at every session's start.
    assert (config["segment.bytes"].value, config["segment.ms"].value) == (str(16 * 2**20), "3600000")
    election = config["unclean.leader.election.enable"]
    assert (election.value, election.is_default) == ("false", False)  # the topic's own, not the cluster's
    assert f"the relay positions topic {given!r} is not compacted" in job.output()
    assert f"the relay positions topic {given!r} allows an unclean leader election" in job.output()


def test_an_events_topic_that_allows_an_unclean_election_is_named_once_and_still_published(
    tmp_path: Path, outbox_db: DatabaseUrl, env: dict[str, str], bootstrap: str, events_topic: str
) -> None:
    """An out-of-sync replica made leader drops records the relay recorded as published: they are
    lost for good. The relay cannot mend the user's topic; it names it once, and publishes."""
    unclean = create_topic(bootstrap, unique("unclean"), config={"unclean.leader.election.enable": "true"})
    job, _ = relay_job(tmp_path, env, unique("relay"))
    sent: list[str] = []
    for n in range(2):  # two batches: the second says nothing again
        with psycopg.connect(outbox_db.libpq) as conn:
            sent += [str(add_event(conn, topic, {"n": n}, key="a")) for topic in (unclean, events_topic)]
        wait_for(lambda n=n: len(published(bootstrap, unclean, 1)) == n + 1, 60, f"batch {n + 1}")
    assert [e for *_, e in published(bootstrap, unclean, 1)] == sent[0::2]
    assert [e for *_, e in published(bootstrap, events_topic, 3)] == sent[1::2]
    warned = [line for line in job.output().splitlines() if "allows an unclean leader election" in line]
    assert len(warned) == 1 and repr(unclean) in warned[0], warned
    assert terminate(job) == 0
