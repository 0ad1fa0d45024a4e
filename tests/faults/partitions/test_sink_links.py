"""The sink's executors, stagers and job cut from PostgreSQL and Kafka, held, and healed; the whole loop
on a bad link."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import migrate
from outbox.core.config import DatabaseUrl
from outbox_dev.spark import StandaloneCluster
from outbox_dev.toxiproxy import Link, Toxiproxy
from sinks.ledger import positions
from tests.faults.partitions.links import PARTITIONS, Proxied, server_url_port
from tests.helpers import (
    Job,
    OwnPostgres,
    committed_messages,
    create_topic,
    fresh_database,
    measured,
    reported,
    unique,
    wait_for,
)
from tests.relay_support import (
    ACTIVE,
    Committed,
    Writers,
    check_two_readers,
    relay_job,
    terminate,
)
from tests.sink_support import (
    ORDERS,
    check_exactly_once,
    check_with_console,
    hold_partition_1,
    ledger,
    log_ends,
    partition_0_applied_1_waiting,
    produce_orders,
    produce_poison,
)

# -- d: the sink's executors <-> PostgreSQL ------------------------------------------------------------

SINK_TIMEOUT = 3  # the sink's database_timeout: a task drops a silent server after 3-6 s


@pytest.fixture(scope="module")
def spark_behind_links(
    toxiproxy: Toxiproxy, server_url: DatabaseUrl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[StandaloneCluster, tuple[Link, ...]]]:
    """Two one-core workers, each reaching PostgreSQL through a link of its own: the job's URL names
    no port, so libpq takes PGPORT from each process's environment (the driver's goes direct)."""
    upstream = f"127.0.0.1:{server_url_port(server_url)}"
    links = tuple(toxiproxy.link(f"postgres-worker-{n}", upstream) for n in range(2))
    env = [{"PGPORT": str(link.port)} for link in links]
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-behind-links"), workers=2, worker_env=env)
    yield cluster, links
    cluster.stop()
    for link in links:
        link.close()


def sink_job(
    bootstrap: str,
    topic: str,
    url: DatabaseUrl,
    tmp: Path,
    run: str,
    cluster: StandaloneCluster | None = None,
    *,
    mode: str = "plain",
    executors_port: int | None = None,
    per_batch: int = 400,
) -> Job:
    """tests/jobs/sink_tasks_job.py through a URL without a port, the driver's going direct: on
    `cluster` (its workers each behind a link), or in local mode with the executors' Python workers
    reaching PostgreSQL at `executors_port`."""
    argv = [
        "tests/jobs/sink_tasks_job.py",
        bootstrap,
        topic,
        portless(url).raw,
        str(tmp / "checkpoint"),
        str(tmp / run),
    ]
    env = {"PGPORT": str(server_url_port(url)), "DATABASE_TIMEOUT": str(SINK_TIMEOUT)}
    if cluster is not None:
        env["SPARK_MASTER"] = cluster.url
    if executors_port is not None:
        env["EXECUTOR_PGPORT"] = str(executors_port)
    return Job([*argv, str(per_batch), mode, "available-now"], tmp / f"{run}.log", env)


def portless(url: DatabaseUrl) -> DatabaseUrl:
    return DatabaseUrl.parse(url.raw.replace(f":{server_url_port(url)}/", "/", 1))


def task_waiting_on_partition_1(pg: psycopg.Connection, cluster: StandaloneCluster) -> int:
    """The worker whose task waits on partition 1's ledger row, once partition 0 has committed."""
    wait_for(lambda: partition_0_applied_1_waiting(pg), 240, "partition 0 committed, 1 waiting")
    name = pg.execute("SELECT application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    task = re.fullmatch(r"outbox-sink task, pid (\d+)", name.fetchone()[0])  # type: ignore[index]
    assert task is not None
    return cluster.worker_of(int(task[1]))


def executor_lines(cluster: StandaloneCluster, app_id: str, text: str) -> list[str]:
    """The lines holding `text` that the executors of application `app_id` wrote to stderr."""
    logs = cluster.root.glob(f"worker-*/{app_id}/*/stderr")
    return [line for log in logs for line in log.read_text(errors="replace").splitlines() if text in line]


def test_an_executor_cut_from_postgres_mid_apply_has_its_task_retried_on_another(  # type: ignore[no-untyped-def]
    spark_behind_links, outbox_db, pg, bootstrap, topic, tmp_path
) -> None:
    """Partition 1's task holds its ledger row when its executor's link is cut and the answers stop.
    The task drops the silent connection, starts over, gives up after its budget; Spark runs it on
    the other executor, which waits until the server has ended the lost session (and its locks),
    then applies. The cut worker's link heals only after the batch: nothing is applied twice."""
    cluster, links = spark_behind_links
    pg.execute(ORDERS)
    dead = produce_poison(bootstrap, topic)
    expected = produce_orders(bootstrap, topic, 1500)
    with psycopg.connect(outbox_db.libpq) as blocker:
        hold_partition_1(blocker, topic)
        # Two batches, not five: each batch's task on the cut worker waits out its budget (about 17 s).
        job = sink_job(bootstrap, topic, outbox_db, tmp_path, "cut-executor", cluster, per_batch=800)
        try:
            cut = links[task_waiting_on_partition_1(pg, cluster)]
            cut.cut()
            blocker.rollback()  # the task's session takes the row; its answer is lost on the way
            assert job.wait(300) == 0, job.output()
        finally:
            job.kill9()
            cut.heal()
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    check_with_console(pg, bootstrap, topic, dead=dead)
    app_id = re.search(r"^application (app-[\w-]+)$", job.output(), re.M)
    assert app_id is not None, job.output()
    lost = executor_lines(cluster, app_id[1], "starting over for up to")
    # One line a task attempt that lost its server (each batch's task on the cut worker), not one a retry.
    assert lost and all(f"PostgreSQL at {portless(outbox_db).safe}" in line for line in lost), lost
    pids = [re.match(r"sink task \(pid (\d+)\)", line) for line in lost]
    assert len({p[1] for p in pids if p}) == len(lost), lost


def test_every_executor_cut_from_postgres_mid_apply_resumes_after_the_heal(  # type: ignore[no-untyped-def]
    spark_behind_links, outbox_db, pg, bootstrap, topic, tmp_path
) -> None:
    """Both executors cut while a task holds its ledger row: the task starts over until the links
    heal, within its budget, and the batch completes; the time from the heal to the ledger at the
    log's end is printed."""
    cluster, links = spark_behind_links
    pg.execute(ORDERS)
    dead = produce_poison(bootstrap, topic)
    expected = produce_orders(bootstrap, topic, 1500)
    ends = log_ends(bootstrap, topic)
    with psycopg.connect(outbox_db.libpq) as blocker:
        hold_partition_1(blocker, topic)
        job = sink_job(bootstrap, topic, outbox_db, tmp_path, "cut-all", cluster)
        try:
            task_waiting_on_partition_1(pg, cluster)
            for link in links:
                link.cut()
            blocker.rollback()
            time.sleep(2 * SINK_TIMEOUT + 2)  # the task has dropped its connection, and starts over
            for link in links:
                link.heal()
            at = time.monotonic()
            wait_for(lambda: ledger(pg) == ends, 120, "every partition applied after the heal")
            measured("heal to resume: a sink task cut from PostgreSQL", time.monotonic() - at)
            assert job.wait(120) == 0, job.output()
        finally:
            job.kill9()
            for link in links:
                link.heal()
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    check_with_console(pg, bootstrap, topic, dead=dead)


@pytest.mark.parametrize("outage", ["refused", "silent"])
def test_stagers_that_cannot_reach_postgres_start_over_until_they_can(  # type: ignore[no-untyped-def]
    postgres_link, outbox_db, pg, bootstrap, topic, tmp_path, outage
) -> None:
    """apply_in='driver': the tasks COPY each batch into the stage table, the driver applies it. The
    executors' link to PostgreSQL is down as the first batch is staged, refusing connections (a
    restart, a failover) or silent (a partition), until a stager has given up on it once and a
    timeout more. Before, a stager connected with no timeout, no keepalive and nothing watching:
    refused, it failed its task, both attempts, and the query; silent, it waited for as long as the
    link held. Now each says once that it starts over, does so under an attempt id of its own until
    it reaches the server, and every event is applied once."""
    pg.execute(ORDERS)
    dead = produce_poison(bootstrap, topic)
    expected = produce_orders(bootstrap, topic, 1500)
    link = postgres_link
    down, up = (link.close, link.open) if outage == "refused" else (link.cut, link.heal)
    down()
    healed = False
    job = sink_job(
        bootstrap, topic, outbox_db, tmp_path, f"stagers-{outage}", mode="driver", executors_port=link.port
    )
    try:
        job.wait_for_output("starting over for up to", 180)  # within its timeout, not at the heal
        time.sleep(SINK_TIMEOUT)
        up()
        healed = True
        assert job.wait(300) == 0, job.output()
    finally:
        job.kill9()
        if not healed:
            up()
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    check_with_console(pg, bootstrap, topic, dead=dead)
    lost = [line for line in job.output().splitlines() if "starting over for up to" in line]
    assert lost and all("sink stager (pid" in line for line in lost), lost


# A stager's COMMIT held at the server: a deferred trigger on each stage table the driver makes sleeps
# once, in the first stager's commit to reach it. The answer is then lost by cutting the link while it
# sleeps; the commit is made all the same (the server learns nothing of the cut until it answers).
HOLD_STAGERS_COMMIT = """
CREATE TABLE commit_hold (armed boolean NOT NULL);
INSERT INTO commit_hold VALUES (true);
CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('application_name') LIKE 'outbox-sink stager%' THEN
        UPDATE commit_hold SET armed = false WHERE armed;
        IF FOUND THEN
            PERFORM pg_sleep({hold});
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION hold_stage_commits() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE made record;
BEGIN
    FOR made IN SELECT objid::regclass AS stage FROM pg_event_trigger_ddl_commands()
                WHERE object_type = 'table' AND objid::regclass::text LIKE '%sink_stage_%' LOOP
        EXECUTE format('CREATE CONSTRAINT TRIGGER hold AFTER INSERT ON %s DEFERRABLE INITIALLY DEFERRED'
                       ' FOR EACH ROW EXECUTE FUNCTION hold_commit()', made.stage);
    END LOOP;
END $$;
CREATE EVENT TRIGGER hold_stage_commits ON ddl_command_end WHEN TAG IN ('CREATE TABLE AS')
    EXECUTE FUNCTION hold_stage_commits();
"""


def test_a_stager_whose_commit_is_made_but_whose_answer_is_lost_has_those_rows_never_applied(  # type: ignore[no-untyped-def]
    postgres_link, outbox_db, pg, bootstrap, topic, tmp_path
) -> None:
    """apply_in='driver': a stager's COMMIT is made at the server, and its answer lost on the link.
    The stager cannot tell a commit made from one never made; it starts over under an attempt id of
    its own, and the driver applies only the attempts the tasks reported: the rows of the lost try
    stay in the stage, never applied, and every event is applied once."""
    hold = 2 * SINK_TIMEOUT  # long enough to cut the link while it lasts
    pg.execute(ORDERS)
    pg.execute(HOLD_STAGERS_COMMIT.format(hold=hold))
    dead = produce_poison(bootstrap, topic)
    expected = produce_orders(bootstrap, topic, 1500)
    job = sink_job(
        bootstrap, topic, outbox_db, tmp_path, "answer-lost", mode="driver", executors_port=postgres_link.port
    )
    try:

        def held() -> bool:
            row = pg.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                " AND application_name LIKE 'outbox-sink stager%'"
            ).fetchone()
            return row == (1,)

        wait_for(held, 180, "a stager's commit held")
        postgres_link.cut()
        made = lambda: pg.execute("SELECT armed FROM commit_hold").fetchone() == (False,)  # noqa: E731
        wait_for(made, 2 * hold, "the held commit made")
        postgres_link.heal()
        assert job.wait(300) == 0, job.output()
    finally:
        job.kill9()
        postgres_link.heal()
    check_exactly_once(pg, bootstrap, topic, expected, dead=dead)
    check_with_console(pg, bootstrap, topic, dead=dead)
    lost = [line for line in job.output().splitlines() if "starting over for up to" in line]
    assert lost and all("sink stager (pid" in line for line in lost), lost


def test_a_failover_away_from_a_primary_cut_off_mid_batch_applies_every_event_once(  # type: ignore[no-untyped-def]
    toxiproxy: Toxiproxy, bootstrap: str, topic: str, tmp_path: Path
) -> None:
    """The primary goes silent behind its link (a partition: nothing answered, nothing closed) while a
    batch's task waits on a ledger row, and its synchronous replica is promoted; the job's URL names
    both, as HA setups do. The task drops its silent session and applies on the new primary; so does
    the driver, whose connection waited idle through the tasks, for the batch's record. (Before, the
    driver waited on that connection for ever, and the query with it.)"""
    primary = OwnPostgres(tmp_path / "primary", durable=True)
    replica: OwnPostgres | None = None
    link = toxiproxy.link(unique("primary"), f"127.0.0.1:{primary.port}")
    try:
        migrate.upgrade(primary.url, "public")
        primary.execute(ORDERS)
        replica = primary.replica(tmp_path / "replica", synchronous=True)
        url = (
            f"postgresql://postgres@127.0.0.1:{link.port},127.0.0.1:{replica.port}/postgres"
            "?target_session_attrs=read-write"
        )
        expected = produce_orders(bootstrap, topic, 1500)
        argv = ["tests/jobs/sink_tasks_job.py", bootstrap, topic, url, str(tmp_path / "checkpoint")]
        env = {"DATABASE_TIMEOUT": str(SINK_TIMEOUT)}
        with (
            psycopg.connect(primary.url.libpq) as blocker,
            psycopg.connect(primary.url.libpq, autocommit=True) as pg,
        ):
            hold_partition_1(blocker, topic)
            job = Job(
                [*argv, str(tmp_path / "work"), "400", "plain", "available-now"], tmp_path / "job.log", env
            )
            try:
                wait_for(lambda: partition_0_applied_1_waiting(pg), 240, "partition 0 committed, 1 waiting")
                link.cut()
                replica.execute("SELECT pg_promote()")
                assert job.wait(180) == 0, job.output()[-6000:]
            finally:
                job.kill9()
                blocker.rollback()  # a commit would wait for ever for the replica promoted away
        with psycopg.connect(replica.url.libpq, autocommit=True) as promoted:
            check_exactly_once(promoted, bootstrap, topic, expected)
            check_with_console(promoted, bootstrap, topic)
    finally:
        link.close()
        for server in (primary, replica):
            if server is not None:
                server.stop()


# -- d: the sink job's links, and e: the whole loop on a bad link -------------------------------------

LOOP_TABLE = "loop_events"
SOAK_FLAGS = (
    "--kafka-timeout",
    "5",
    "--database-timeout",
    "5",
    "-X",
    "request.timeout.ms=5000",
    "--no-cleanup",
)


@dataclass(frozen=True)
class Loop:
    """The loop, running: writers -> outbox -> the relay -> `topic` -> the sink job -> a table of its
    own database, with one outbox event a row it writes (so a row applied twice shows)."""

    kafka: Proxied
    source: DatabaseUrl  # the writers' database, direct
    topic: str
    relay: Job
    sink: Job
    conn: psycopg.Connection  # to the sink's database, direct

    def rows(self) -> int:
        assert self.sink.process.poll() is None, self.sink.output()[-4000:]
        return int(self.conn.execute(f"SELECT count(*) FROM {LOOP_TABLE}").fetchone()[0])  # type: ignore[index]

    def check(self, committed: Committed, timeout: float = 120) -> dict[str, Any]:
        """Every committed event: once in the relay's topic, by both readers and `outbox verify`; once
        in the sink's table, its ledger at the topic's ends. Returns when each row was applied."""
        wait_for(lambda: self.rows() == committed.count, timeout, "every committed event in the sink's table")
        ours = check_two_readers(self.kafka.direct, self.topic, PARTITIONS, committed, self.source)
        ends = {(self.topic, p): o + 1 for p, o, _, _ in sorted(ours)}
        assert positions(self.conn, "public", f"public.{LOOP_TABLE}") == ends
        applied = dict(self.conn.execute(f"SELECT event_id::text, applied_at FROM {LOOP_TABLE}").fetchall())
        assert sorted(applied) == sorted(e for ids in committed.by_key.values() for e in ids)
        assert self.conn.execute("SELECT count(*) FROM outbox_events").fetchone() == (len(applied),)
        return applied


@contextlib.contextmanager
def loop(
    kafka: Proxied,
    db: Proxied,
    server_url: DatabaseUrl,
    tmp: Path,
    *,
    relay_through: bool,
    sink_kafka: str,
    sink_through: bool,
    sink_env: dict[str, str] | None = None,
) -> Iterator[Loop]:
    """Start the loop on a new topic: the relay through the links or direct, the sink job reading
    `sink_kafka` and reaching PostgreSQL through the link or direct. Everything stops on the way out."""
    source = DatabaseUrl.parse(db.direct)
    topic = create_topic(kafka.direct, unique("loop"), partitions=PARTITIONS)
    through = {"DATABASE_URL": db.proxied, "KAFKA_BOOTSTRAP_SERVERS": kafka.proxied}
    direct = {"DATABASE_URL": db.direct, "KAFKA_BOOTSTRAP_SERVERS": kafka.direct}
    label = unique("loop")
    relay, _ = relay_job(tmp, through if relay_through else direct, unique("relay"), *SOAK_FLAGS, label=label)
    with fresh_database(server_url) as sink_url, psycopg.connect(sink_url.libpq, autocommit=True) as conn:
        migrate.upgrade(sink_url, "public")
        conn.execute(
            f"CREATE TABLE {LOOP_TABLE} (event_id uuid PRIMARY KEY, n int, topic text NOT NULL,"
            " applied_at timestamptz DEFAULT clock_timestamp())"
        )
        port = server_url_port(sink_url)
        url = sink_url.raw.replace(f":{port}/", f":{db.links[0].port}/", 1) if sink_through else sink_url.raw
        work = tmp / label
        argv = [sink_kafka, topic, url, LOOP_TABLE, "loop-out", str(work / "cp"), str(work)]
        sink = Job(["tests/jobs/loop_sink_job.py", *argv], tmp / f"{label}-sink.log", sink_env or {})
        try:
            sink.wait_for_output("started", 180)
            relay.wait_for_output(ACTIVE, 60)
            yield Loop(kafka, source, topic, relay, sink, conn)
        except AssertionError as exc:  # a stall says little by itself: the jobs' lines say why
            exc.add_note(f"--- the sink job's log, its end:\n{sink.output()[-6000:]}")
            exc.add_note(f"--- the relay's log, its end:\n{relay.output()[-2000:]}")
            raise
        finally:
            sink.kill9()
            assert terminate(relay) == 0


def test_the_sink_job_cut_from_kafka_mid_batch_resumes_after_the_heal(  # type: ignore[no-untyped-def]
    kafka: Proxied, db: Proxied, server_url: DatabaseUrl, tmp_path: Path
) -> None:
    """The sink job's driver and tasks reach Kafka through the link, cut while it applies the events
    being written and held past its poll timeout; the relay goes direct. After the heal every
    committed event is in the table once, and the job said each stall once and its end once."""
    env = {"POLL_TIMEOUT_MS": "3000"}
    with loop(
        kafka,
        db,
        server_url,
        tmp_path,
        relay_through=False,
        sink_kafka=kafka.proxied,
        sink_through=False,
        sink_env=env,
    ) as running:
        first = Writers(running.source, running.topic).start(transactions=20)
        first.join()
        second = Writers(running.source, running.topic).start(transactions=60, max_delay=0.1)
        wait_for(lambda: running.rows() > first.committed.count, 120, "the sink applying the second round")
        kafka.cut()
        second.join()
        time.sleep(8)  # past the job's poll timeout (3 s) and its calls' (3 s)
        committed = Committed.merged(first.committed, second.committed)
        kafka.heal()
        at = time.monotonic()
        wait_for(lambda: running.rows() == committed.count, 120, "every committed event in the sink's table")
        measured("heal to resume: the sink job (driver and tasks) cut from Kafka", time.monotonic() - at)
        running.check(committed)
        said = running.sink.output()
    assert said.count("waiting for it") == said.count("reading again after"), said[-4000:]


def test_the_sink_outlives_postgresql_unreachable_mid_batch(  # type: ignore[no-untyped-def]
    kafka: Proxied, db: Proxied, server_url: DatabaseUrl, tmp_path: Path
) -> None:
    """The sink job reaches PostgreSQL through the link, which goes away twice for 5 s while the job
    applies (every connection dropped, new ones refused), as in a restart or a failover. A task that
    lost its connection starts over, and so does a batch whose driver did: each says so in one line
    and in one more once applied; the query lives on, and every event is applied once. (Before, a
    batch that started while the server was away failed the query.)"""
    (link,) = db.links
    with loop(
        kafka, db, server_url, tmp_path, relay_through=False, sink_kafka=kafka.direct, sink_through=True
    ) as running:
        # Writing until both outages are over, so that each falls while events arrive: batches meet it.
        writers = Writers(running.source, running.topic).start(max_delay=0.6)
        for _ in range(2):
            seen = running.rows()
            wait_for(lambda seen=seen: running.rows() > seen, 60, "the sink applying new events")
            link.close()
            time.sleep(5)
            link.open()
        writers.stop.set()
        writers.join()
        running.check(writers.committed)
        said = running.sink.output()
    starts, ends = said.count("starting over for up to"), said.count("applied after")
    assert starts == ends >= 1, said[-4000:]


def worsen(links: tuple[Link, ...]) -> None:
    """Each answer 200 +- 50 ms late; a third of the connections dropped mid-stream once 100 kB have
    crossed them either way (Toxiproxy's limit_data; its reset_peer passes no byte before the reset,
    a black hole). Not every one: a link that dropped every connection at 100 kB could never carry
    a larger answer, which no real network does."""
    for link in links:
        link.add("latency", "downstream", latency=200, jitter=50)
        link.add("limit_data", "both", toxicity=0.3, bytes=100_000)


@dataclass(frozen=True)
class Soak:
    events: int
    seconds: float  # from the first event's transaction to the last event applied by the sink
    relay: list[float]  # per event: its transaction's start to its record's Kafka timestamp
    loop: list[float]  # per event: its transaction's start to its row in the sink's table

    def line(self) -> str:
        return (
            f"{self.events} events, {self.events / self.seconds:.0f}/s;"
            f" to Kafka {tail(self.relay)}; to the sink's table {tail(self.loop)}"
        )


def tail(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p50, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.99))
    return f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def soak(kafka: Proxied, db: Proxied, server_url: DatabaseUrl, tmp: Path, bad: bool) -> Soak:
    """The loop under load, the relay and the sink job through the links, made `bad` (worsen) once
    both run: 8 writers commit 200 transactions each at a steady pace. Checked record by record.
    The load starts once the sink has applied a first event: its first batch (mostly the Spark
    session's first job) takes seconds, measured on its own, and is not the loop's tail."""
    with loop(
        kafka, db, server_url, tmp, relay_through=True, sink_kafka=kafka.proxied, sink_through=True
    ) as running:
        first = Writers(running.source, running.topic, writers=1, keys_per_writer=1).start(transactions=1)
        first.join()
        at = time.monotonic()
        wait_for(lambda: running.rows() == first.committed.count, 180, "the sink's first event")
        measured(
            f"the loop's first event to the sink's table ({'bad' if bad else 'clean'} links)",
            time.monotonic() - at,
        )
        if bad:
            worsen((*kafka.links, *db.links))
        writers = Writers(running.source, running.topic, writers=8).start(transactions=200, max_delay=0.2)
        writers.join()
        applied = running.check(Committed.merged(first.committed, writers.committed), timeout=300)
        for warm_up in (e for ids in first.committed.by_key.values() for e in ids):
            del applied[warm_up]
    with psycopg.connect(running.source.libpq) as conn:
        query = "SELECT event_id::text, created_at FROM outbox_events WHERE topic = %s"
        created = dict(conn.execute(query, [running.topic]).fetchall())
    stamped = {
        dict(m.headers() or {})["event_id"].decode(): m.timestamp()[1] / 1000
        for m in committed_messages(kafka.direct, running.topic, PARTITIONS)
    }
    relayed = [stamped[e] - created[e].timestamp() for e in applied]
    looped = [(applied[e] - created[e]).total_seconds() for e in applied]
    seconds = (max(applied.values()) - min(created[e] for e in applied)).total_seconds()
    return Soak(len(applied), seconds, relayed, looped)


@pytest.mark.soak
def test_a_soak_on_a_bad_link_loses_nothing(  # type: ignore[no-untyped-def]
    kafka: Proxied, db: Proxied, server_url: DatabaseUrl, tmp_path: Path
) -> None:
    """The loop under the same load twice: on clean links, then with the relay's and the sink job's
    links (Kafka and PostgreSQL) made bad (worsen). Both runs: every committed event once, by both
    readers, and once in the sink's table; their throughput and tail are printed side by side."""
    clean = soak(kafka, db, server_url, tmp_path, bad=False)
    bad = soak(kafka, db, server_url, tmp_path, bad=True)
    reported("a soak on clean links", clean.line())
    reported("the same soak, answers 200 +- 50 ms late, a third of connections dropped", bad.line())
