"""The conductor: services, the Spark job and the relay as children, the kills, the final read.

Everything it starts dies with it (parent-death signal) and lives under one
scratch directory that is deleted at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from demos.loop import formats, plan, traces
from demos.loop.fill import Filler
from demos.loop.show import Display, Timeline
from demos.loop.verdict import Input, Out, Verdict, committed_events, judge
from outbox import migrate
from outbox.core.committed import read_committed
from outbox.core.config import DatabaseUrl
from outbox.core.errors import ConfigError
from outbox.core.kafka import client_settings
from outbox_dev.connect import ConnectServer
from outbox_dev.kafka import Broker, Cluster, replicas
from outbox_dev.process import spawn
from outbox_dev.process import tail as tail_of

SCHEMA = "outbox_demo"
TABLE = "squares"
INPUT, OUTPUT = "demo.numbers", "demo.squares"
RELAY_NAME = "demo-relay"
# What a component prints once it is at work (None: it is as soon as it runs).
WORK_SIGNS = {"spark": "applied ", "relay": None}


@dataclass
class Outcome:
    verdict: Verdict
    applied: int
    latencies: list[float]  # seconds, input commit to output read
    killed: dict[str, int]
    exits: int
    timeline: Timeline
    warmups: list[float]  # seconds from each start of the Spark job to its first batch
    traces: list[traces.Traced]

    def ok(self, planned: dict[str, int]) -> bool:
        return (
            self.verdict.ok
            and self.applied == self.verdict.committed_in
            and self.killed == planned
            and bool(self.traces)
            and all(t.ok for t in self.traces)
        )


@dataclass(frozen=True)
class Settings:
    events: int
    accounts: int
    partitions: int
    window: float  # seconds over which the input is produced and the kills are spread
    kills: dict[str, int]  # spark, relay, broker
    seed: int
    drain_timeout: float
    connect: bool = False  # the Spark job a Spark Connect client of a server of the demo's own
    registry: str | None = None  # the input as Avro under this schema registry (else JSON)


class Child:
    """A component the demo kills -9 and starts again: a Python program in its own process group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.argv, self.env, self.logs = name, argv, env, logs
        self.incarnation = 0
        self.warmups: list[float] = []
        self.start()

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}-{self.incarnation}.log"

    def start(self) -> None:
        self.incarnation += 1
        self.started = time.monotonic()
        self.working: float | None = None  # when it was first seen at work
        self.process = spawn(
            [sys.executable, *self.argv], self.log, die_with_parent=signal.SIGKILL, env=self.env
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(30)
        except Exception:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def exited(self) -> int | None:
        return self.process.poll()

    def at_work(self, sign: str | None) -> float:
        """Seconds this incarnation has been at work: since it printed `sign` (None: since it started)."""
        if self.working is None and (sign is None or self.said(sign)):
            self.working = self.started if sign is None else time.monotonic()
            if sign is not None:
                self.warmups.append(self.working - self.started)
        return 0.0 if self.working is None else time.monotonic() - self.working

    def said(self, text: str) -> bool:
        try:
            return text in self.log.read_text(errors="replace")
        except OSError:
            return False


class ConnectChild(Child):
    """The Spark job as a Spark Connect client, with its server: the server runs the query, its
    batches and tasks, so a kill -9 of the job is of both, and the server starts first again."""

    def __init__(self, server: ConnectServer, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.server = server
        super().__init__("spark", argv, {**env, "SPARK_REMOTE": server.url}, logs)

    def start(self) -> None:
        if self.server.process is None:
            self.server.start()
        super().start()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        super().kill(sig)
        self.server.kill9()


class Tail(threading.Thread):
    """Reads the output topic read_committed as it grows: the live 'published' count and latencies."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        super().__init__(name="tail", daemon=True)
        self.consumer = Consumer(
            client_settings(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"demo-tail-{os.getpid()}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                },
                "consumer",
            )
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.seen: dict[str, float] = {}  # event id -> wall time first read
        self.records = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                m = self.consumer.poll(0.2)  # one at a time: each stamped as it arrives
                if m is not None and m.error() is None and m.value():
                    self.records += 1
                    event_id = json.loads(m.value()).get("event_id")
                    self.seen.setdefault(event_id, time.time())
        finally:
            self.consumer.close()


class Sampler(threading.Thread):
    """Counts each stage a few times a second, for the display and the chart."""

    def __init__(self, loop: Loop, filler: Filler, tail: Tail) -> None:
        super().__init__(name="sampler", daemon=True)
        self.loop, self.filler, self.tail = loop, filler, tail
        self.applied = 0
        self.stopping = threading.Event()

    @property
    def published(self) -> int:
        return len(self.tail.seen)

    def run(self) -> None:
        with psycopg.connect(self.loop.url.libpq, autocommit=True) as conn:
            while not self.stopping.wait(0.25):
                self.sample(conn)
            self.sample(conn)  # the last word on the display is the final count

    def sample(self, conn: psycopg.Connection) -> None:
        loop, filler, tail = self.loop, self.filler, self.tail
        # Each account's committed seqs are 1, 2, ...: the latest ones add up to the events applied.
        query = sql.SQL("SELECT coalesce(sum(seq), 0) FROM {}").format(sql.Identifier(SCHEMA, TABLE))
        self.applied = int(conn.execute(query).fetchone()[0])  # type: ignore[index]
        counts = {"produced": filler.committed, "applied": self.applied, "published": self.published}
        loop.timeline.samples.append((loop.now(), *counts.values()))
        notes = {
            "produced": f"{filler.aborted} aborted txns, {filler.redelivered} redelivered",
            "published": f"{tail.records - self.published} duplicate reads",
        }
        loop.display.update(counts, notes, loop.killed, loop.exits)


class Loop:
    def __init__(
        self,
        settings: Settings,
        url: DatabaseUrl,
        kafka: str | Broker | Cluster,
        work: Path,
        display: Display,
    ) -> None:
        self.s, self.url, self.work, self.display = settings, url, work, display
        self.broker = None if isinstance(kafka, str) else kafka
        self.bootstrap = kafka if isinstance(kafka, str) else kafka.bootstrap
        self.timeline = Timeline()
        self.killed = dict.fromkeys(settings.kills, 0)
        self.exits = 0
        self.t0, self.wall0 = time.monotonic(), time.time()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def prepare(self) -> None:
        with psycopg.connect(self.url.libpq, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate.upgrade(self.url, SCHEMA)
        with psycopg.connect(self.url.libpq, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (account bigint PRIMARY KEY, seq bigint NOT NULL,"
                    " event_id uuid NOT NULL, n bigint NOT NULL, square bigint NOT NULL)"
                ).format(sql.Identifier(SCHEMA, TABLE))
            )
        admin = AdminClient(client_settings({"bootstrap.servers": self.bootstrap}, "admin"))
        stamp = f"{int(time.time())}"
        self.input, self.output = f"{INPUT}.{stamp}", f"{OUTPUT}.{stamp}"
        brokers = len(admin.list_topics(timeout=30).brokers)
        topics = [NewTopic(t, self.s.partitions, replicas(brokers)[0]) for t in (self.input, self.output)]
        for future in admin.create_topics(topics).values():
            future.result(30)

    def children(self) -> tuple[Child, Child]:
        env = {**os.environ, "DATABASE_URL": self.url.raw, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap}
        env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        job = [
            "-m",
            "demos.loop.transform",
            self.bootstrap,
            self.input,
            self.output,
            SCHEMA,
            TABLE,
            str(self.work / "checkpoint"),
            str(self.work / "spark"),
            *([self.s.registry] if self.s.registry else []),
        ]
        spark = (
            ConnectChild(ConnectServer(self.work / "connect", env=env), job, env, logs)
            if self.s.connect
            else Child("spark", job, env, logs)
        )
        relay = Child(
            "relay",
            [
                "-m",
                "outbox",
                "relay",
                "--name",
                RELAY_NAME,
                "--schema",
                SCHEMA,
                "--metrics-address",
                "off",
                "--log-format",
                "text",
                "--batch-size",
                "2000",
                "--poll-interval",
                "0.2",
            ],
            env,
            logs,
        )
        return spark, relay

    def run(self) -> Outcome:
        self.prepare()
        rng = random.Random(self.s.seed)
        txns = plan.transactions(self.s.events, accounts=self.s.accounts, size=50, rng=rng)
        kills = plan.kills(self.s.window, **self.s.kills, rng=rng)
        encode = formats.avro_encoder(self.s.registry, self.input) if self.s.registry else formats.json_value
        filler = Filler(self.bootstrap, self.input, txns, self.s.window, encode)
        tail = Tail(self.bootstrap, self.output, self.s.partitions)
        sampler = Sampler(self, filler, tail)
        spark, relay = self.children()
        try:
            self._wait_started(spark)
            self.t0, self.wall0 = time.monotonic(), time.time()
            for thread in (filler, tail, sampler):
                thread.start()
            self._conduct(kills, filler, sampler, {"spark": spark, "relay": relay})
        finally:
            for thread in (filler, tail, sampler):
                thread.stopping.set()
            for child in (spark, relay):
                child.kill(signal.SIGKILL)
            for thread in (tail, sampler):
                if thread.is_alive():
                    thread.join(10)
        self.display.say("reading both topics back, read_committed, from the start")
        config = {"bootstrap.servers": self.bootstrap}
        given = committed_events(
            ((m.partition(), m.offset(), m.value()) for m in read_committed(config, self.input)),
            formats.decode,
        )
        outputs = [
            Out(m.partition(), m.offset(), (m.key() or b"").decode(), m.value())
            for m in read_committed(config, self.output)
        ]
        latencies = [
            seen - filler.committed_at[e] for e, seen in tail.seen.items() if e in filler.committed_at
        ]
        verdict = judge(given.events, given.copies, outputs)
        problems = (
            verdict.duplicates + verdict.missing + verdict.out_of_order + verdict.leaked + verdict.wrong
        )
        self.display.verified(len(outputs), problems)
        return Outcome(
            verdict,
            sampler.applied,
            latencies,
            self.killed,
            self.exits,
            self.timeline,
            spark.warmups,
            self._trace(given, filler),
        )

    def _trace(self, given: Input, filler: Filler) -> list[traces.Traced]:
        """`outbox trace` of an event the Spark job was killed with, and of the poison one."""
        self.display.say("following events with `outbox trace`")
        kills = [self.wall0 + t for t, c in self.timeline.kills if c == "spark"]
        with psycopg.connect(self.url.libpq, autocommit=True) as conn:
            flight = traces.in_flight(
                conn, SCHEMA, self.input, kills, filler.committed_at, given.events, given.at
            )
        picks = [*([flight] if flight else []), *traces.poison(self.input, given.poison, given.at)]
        return [traces.run(p, SCHEMA, self.url.raw, self.bootstrap) for p in picks]

    def _wait_started(self, spark: Child, timeout: float = 180.0) -> None:
        """Produce nothing before the Spark job runs, so that its first start is not counted as latency."""
        self.display.say("starting the Spark job")
        deadline = time.monotonic() + timeout
        while not spark.said("started"):
            if spark.exited() is not None or time.monotonic() > deadline:
                raise ConfigError(f"the demo's Spark job did not start: {tail_of(spark.log)}")
            time.sleep(0.2)
        self.display.say(f"Spark job running after {time.monotonic() - spark.started:.0f}s; producing")

    def _conduct(
        self, kills: list[plan.Kill], filler: Filler, sampler: Sampler, children: dict[str, Child]
    ) -> None:
        """The main thread's job: kill what is due, start again what died, stop once all is out.

        Children are only ever started from this thread: their parent-death signal
        fires when the *thread* that started them ends.
        """
        pending = list(kills)
        give_up = self.s.window + self.s.drain_timeout
        drain_deadline: float | None = None
        while True:
            time.sleep(0.25)
            if filler.error is not None:
                raise ConfigError(f"the input producer failed: {filler.error}")
            for name, child in children.items():
                code = child.exited()
                if code is not None:
                    self.exits += 1
                    self.display.say(
                        f"{name} exited on its own (code {code}); starting it again: {child.log}"
                    )
                    child.start()
            for k in [k for k in pending if k.at <= self.now()]:
                if self._strike(k, children, idle=sampler.applied >= self.s.events):
                    pending.remove(k)
            if self.now() > give_up:
                self.display.say(f"gave up after {give_up:.0f}s; kills still pending: {len(pending)}")
                return
            if filler.is_alive() or pending:
                continue
            if sampler.applied >= self.s.events and sampler.published >= self.s.events:
                return
            drain_deadline = drain_deadline or time.monotonic() + self.s.drain_timeout
            if time.monotonic() > drain_deadline:
                self.display.say(f"the pipeline did not drain within {self.s.drain_timeout:.0f}s")
                return

    def _strike(self, kill: plan.Kill, children: dict[str, Child], idle: bool) -> bool:
        """Kill one component now if it has been at work long enough since it (re)started; False to wait.

        idle: everything is applied, so a Spark job that runs is as busy as it will get.
        """
        component = kill.component
        if component == "broker":
            if self.broker is None:
                return True
            self.timeline.kills.append((self.now(), "broker"))
            if isinstance(self.broker, Cluster):  # each node in turn
                nodes = sorted(self.broker.services)
                node = nodes[self.killed["broker"] % len(nodes)]
                self.display.say(f"kill -9 Kafka node {node} of {len(nodes)}; restarting it on its log")
                self.broker.kill(node)
                self.broker.start(node)
            else:
                self.display.say("kill -9 the Kafka broker; restarting it on the same log")
                self.broker.restart(signal.SIGKILL)
            self.killed["broker"] += 1
            return True
        child = children[component]
        sign = None if idle and child.said("started") else WORK_SIGNS[component]
        if child.at_work(sign) < kill.working:
            return False
        self.timeline.kills.append((self.now(), component))
        child.kill()
        self.killed[component] += 1
        self.display.say(f"kill -9 {component} (#{self.killed[component]}); starting it again")
        child.start()
        return True
