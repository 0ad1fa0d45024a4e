"""The user-facing sink: validate at start, then stage and apply each micro-batch."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from outbox.core import tables
from outbox.core.config import database_url, schema_name
from outbox.core.errors import ServiceUnavailable
from outbox.core.postgres import connect, keepalive, pooled, scalar, watched
from sinks.errors import SinkError, error
from sinks.ledger import Positions, positions
from sinks.postgres import continuity, direct, evolve
from sinks.postgres import settings as S
from sinks.postgres.apply import BatchResult, apply_batch
from sinks.postgres.catalog import describe
from sinks.postgres.clock import STAGES
from sinks.postgres.continuity import behind, query_id
from sinks.postgres.metrics import SinkMetrics
from sinks.postgres.placement import ApplyIn, Route, choose
from sinks.postgres.plan import ERROR_COLUMN, KAFKA_COLUMNS, Conversion, Plan, plan
from sinks.postgres.retry import MOMENTARY, start_query, with_retries
from sinks.postgres.routing import Delete, Lanes, Routing, Table, Unrouted
from sinks.postgres.settings import Mode, OnError, Outbox
from sinks.postgres.spark_plan import is_connect, planned_tasks, read_plan
from sinks.postgres.spec import SinkSpec
from sinks.postgres.stage import RESULT_SCHEMA, StageJob, moved, stager
from sinks.postgres.statements import Statements
from sinks.postgres.task import COUNTS, TASK_RESULT, TIMES, TaskJob, applier
from sinks.postgres.topics import TopicCheck

log = logging.getLogger("sinks.postgres")


class PostgresSink:
    """Apply a stream of Kafka events to a PostgreSQL table exactly once.

    >>> sink = PostgresSink("orders", key="event_id")
    >>> sink.start(parse_json(kafka_frame, schema), checkpoint_location="/chk/orders")

    Each batch's rows, their outbox events, dead letters and the Kafka offsets
    commit in one transaction, so a replayed batch, a retried task, a
    redelivered event or a lost checkpoint changes nothing.

    Each keyword's default and checks are declared once, in
    sinks/postgres/settings.py.

    Parameters
    ----------
    table : str
        The table to write; it needs a unique index on `key`.
    url : str, optional
        PostgreSQL URL; default the `DATABASE_URL` environment variable.
    schema : str, default "public"
        The table's schema.
    key : str or sequence of str, default "event_id"
        The column or columns of the table's unique index: an event's identity.
    mode : {"upsert", "insert"}, default "upsert"
        "upsert": ``ON CONFLICT DO UPDATE``, the latest position wins; "insert":
        ``DO NOTHING``, the first wins.
    version : str, optional
        A numeric or timestamp column: a row is never replaced by an older
        version, and a stale record is counted apart from a duplicate.
    delete : "tombstone", str, Column or None, default "tombstone"
        Which records delete their key instead of upserting it: "tombstone" (a
        null Kafka value), a SQL boolean expression, a Column, or None.
    on_error : {"dead_letter", "fail"}, default "dead_letter"
        "dead_letter": rows that cannot be written go to `sink_dead_letters` and
        the batch goes on; "fail": the batch fails with the row's position and
        error, and nothing of it is applied.
    outbox : Outbox, optional
        One outbox event per changed row, in the same transaction.
    name : str, optional
        What the ledger keys this sink's offsets by; default "schema.table".
    ledger_schema : str, optional
        The schema of the framework's tables; default `OUTBOX_SCHEMA`, else "public".
    apply_in : {"auto", "tasks", "driver"}, default "auto"
        Where batches are applied. "auto": in the Spark tasks, each task its own
        topic-partitions in one transaction, when the frame's plan proves every
        topic-partition's rows reach one task (a Kafka source without
        minPartitions, narrow steps only); otherwise staged and applied on the
        driver. "tasks" refuses, at start, a frame it cannot prove. "driver"
        always stages.
    kafka : mapping of str to str, optional
        librdkafka settings added to those the sink asks the frame's Kafka
        source's topics with, before each batch (topics.py), where Spark's own
        source is configured for the Java client (credentials, for one).
    database_timeout : float, default 30.0
        Seconds: how soon a task notices that PostgreSQL stopped answering it (a
        partition, a failover). It starts over, and after 4x that fails for
        Spark to retry it; the server ends a task's session that went quiet for
        2x that, and with it the locks a lost task held.
    trace : bool, default False
        Record what each applying statement did with its input records in
        `sink_traces`, in the same transaction, for `outbox trace EVENT_ID` (one
        row per statement, not per record); the outbox events it writes then
        take ids a trace can compute. Prune old rows with `outbox trace --prune DAYS`.
    create : bool, default False
        Make the table when it is missing: a column per field of the frame
        (Kafka's own columns aside), typed from Spark's types, the key its
        primary key.
    evolve : bool, default False
        Add a nullable column for each field the table lacks, before the first
        batch. A column is never dropped or narrowed: a field whose type no
        longer fits its column (text into an integer, a wider decimal) stops
        the query in one line naming the ALTER TABLE that would take it.
    read_kafka : bool, default True
        Where the frame is `parse_json`, `parse_avro` or `parse_protobuf` over a
        Kafka source, applied in the tasks: the tasks read each batch's records
        from Kafka themselves and parse them (sinks/postgres/direct.py); a JSON
        range Arrow may read otherwise than Spark is left to Spark's rows. Spark's
        progress then counts no input row. False: the tasks always take Spark's rows.

    Raises
    ------
    outbox.ConfigError
        A setting is malformed (checked here), or the table does not fit the
        frame (checked by `start`), in one line.
    """

    def __init__(
        self,
        table: str,
        *,
        url: str | None = S.URL.default,
        schema: str = S.SCHEMA.default,
        key: str | Sequence[str] = S.KEY.default,
        mode: Mode = S.MODE.default,
        version: str | None = S.VERSION.default,
        delete: Delete = S.DELETE.default,
        on_error: OnError = S.ON_ERROR.default,
        outbox: Outbox | None = S.OUTBOX.default,
        name: str | None = S.NAME.default,
        ledger_schema: str | None = S.LEDGER_SCHEMA.default,
        apply_in: ApplyIn = S.APPLY_IN.default,
        kafka: Mapping[str, str] | None = S.KAFKA.default,
        database_timeout: float = S.DATABASE_TIMEOUT.default,
        trace: bool = S.TRACE.default,
        create: bool = S.CREATE.default,
        evolve: bool = S.EVOLVE.default,
        read_kafka: bool = S.READ_KAFKA.default,
    ) -> None:
        self.spec = SinkSpec(
            url=database_url(url),
            table=table,
            schema=schema,
            key=(key,) if isinstance(key, str) else tuple(key),
            mode=mode,
            version=version,
            on_error=on_error,
            outbox=outbox,
            ledger_schema=ledger_schema or schema_name(),
            name=name or "",
            apply_in=apply_in,
            database_timeout=database_timeout,
            trace=trace,
            create=create,
            evolve=evolve,
            read_kafka=read_kafka,
        )
        self.delete = delete
        self.kafka = dict(kafka or {})
        self.routing: Routing | None = None
        self._writer: BatchWriter | None = None
        self._query: StreamingQuery | None = None

    @classmethod
    def routed(
        cls,
        by: str | Column,
        tables: Mapping[str, Table],
        *,
        name: str,
        unrouted: Unrouted = "dead_letter",
        url: str | None = S.URL.default,
        on_error: OnError = S.ON_ERROR.default,
        ledger_schema: str | None = S.LEDGER_SCHEMA.default,
        apply_in: ApplyIn = S.APPLY_IN.default,
        kafka: Mapping[str, str] | None = S.KAFKA.default,
        database_timeout: float = S.DATABASE_TIMEOUT.default,
        trace: bool = S.TRACE.default,
    ) -> PostgresSink:
        """One query into several tables, each row's table chosen by the value of `by`.

        >>> sink = PostgresSink.routed("type", {
        ...     "OrderCreated": Table("orders", key="order_id"),
        ...     "OrderPaid": Table("payments", key="payment_id", version="version"),
        ... }, name="orders")

        by: a column of the frame (a field of the events, or `topic`), or a Column,
        such as `header("type")`; its value, as text, picks the table. In each
        transaction every table's rows commit with the one ledger, named `name`.
        unrouted: a row whose value no table takes is a dead letter ("dead_letter"),
        or passed over ("ignore"), the ledger moving past it either way.
        The other keywords are PostgresSink's, for all the tables.
        """
        if not name:
            raise error("SINK_ROUTED_UNNAMED")
        routing = Routing(by, tables, unrouted)
        first = next(iter(tables.values()))
        sink = cls(
            first.name,
            **_table_keywords(first),
            url=url,
            on_error=on_error,
            name=name,
            ledger_schema=ledger_schema,
            apply_in=apply_in,
            kafka=kafka,
            database_timeout=database_timeout,
            trace=trace,
        )
        for table in tables.values():  # each table's settings checked now, as PostgresSink's are
            replace(sink.spec, table=table.name, **_spec_keywords(table))
        sink.routing = routing
        return sink

    @property
    def last(self) -> BatchResult | None:
        """What the last batch of the query started by `start` did. On Spark Connect, where the
        batches run beside the server, read from PostgreSQL (the batch's record)."""
        writer, query = self._writer, self._query
        if writer is None or writer.last is not None or query is None:
            return writer.last if writer else None
        with connect(self.spec.url, autocommit=True) as conn:
            params = {"sink": self.spec.name, "query": str(query.id)}
            row = conn.execute(writer.statements.reported(), params).fetchone()
        return BatchResult(**row[0]) if row and row[0] else None

    @property
    def query(self) -> StreamingQuery | None:
        """The query `start` started."""
        return self._query

    def serve_metrics(self, spark: Any, address: str = "127.0.0.1:0") -> SinkMetrics:
        """Prometheus metrics of this sink's query on HOST:PORT (`.address` says which), fed from the
        session's streaming progress (sinks/postgres/metrics.py); in a Spark Connect client too.
        `.close()` stops them."""
        metrics = SinkMetrics(self)
        metrics.address = metrics.serve(address)
        metrics.listen(spark)
        return metrics

    @property
    def route(self) -> Route | None:
        """Where the query started by `start` applies its batches, and why."""
        return self._writer.route if self._writer else None

    @property
    def name(self) -> str:
        """The ledger's name for this sink (`ledger.sink` of the kafka_rc source)."""
        return self.spec.name

    def writer(self, frame: DataFrame, checkpoint_location: str | None = None) -> BatchWriter:
        """A foreachBatch function for `frame`, checked against the table now, not mid-stream.

        On Spark Connect, name the query's `checkpoint_location`: the writer reads
        the query's id there, which its check that no batch was lost needs."""
        return BatchWriter(self.spec, frame, self.delete, self.kafka, checkpoint_location, self.routing)

    def start(
        self,
        frame: DataFrame,
        checkpoint_location: str,
        *,
        trigger: dict[str, Any] | None = None,
        query_name: str | None = None,
    ) -> StreamingQuery:
        self._writer = self.writer(frame, checkpoint_location)
        stream = frame.writeStream.foreachBatch(self._writer).option(
            "checkpointLocation", checkpoint_location
        )
        if trigger:
            stream = stream.trigger(**trigger)
        if query_name:
            stream = stream.queryName(query_name)
        self._query = start_query(stream.start, f"sink {self.name}")
        return self._query


@dataclass(frozen=True)
class Staged:
    batch_id: int
    attempts: list[int]  # task attempts whose rows count (retried tasks' leftovers do not)
    rows: int
    conn: psycopg.Connection  # holds the sink's advisory lock until the batch is applied
    seconds: float  # the staging job took
    query: str | None  # the streaming query's id, recorded with the batch
    ends: dict[str, list[Any]] | None = None  # a routed sink's: where its ledger moves (stage.moved)
    ignored: int = 0  # a routed sink's rows that no table took


@dataclass(frozen=True)
class Lane:
    """One table the writer applies to: the sink's one, or one of a routed sink's (routing.py)."""

    spec: SinkSpec
    plan: Plan
    statements: Statements  # the driver's, on the shared stage
    in_task: Statements  # a task's, on its own temp stage


def _wanted(
    spec: SinkSpec, delete: Delete, routing: Routing | None
) -> list[tuple[SinkSpec, Delete, Sequence[str] | None]]:
    """Each table's spec, delete rule and the frame's fields it names (routing.Table.columns)."""
    if routing is None:
        return [(spec, delete, None)]
    return [
        (replace(spec, table=t.name, **_spec_keywords(t)), t.delete, t.columns)
        for t in routing.tables.values()
    ]


def _lane(
    conn: psycopg.Connection,
    schema: T.StructType,
    spec: SinkSpec,
    delete: Delete,
    columns: Sequence[str] | None,
    lane: int | None,
) -> Lane:
    """The table's lane: made or evolved first if asked, then planned against the frame's fields
    it takes (a routed table's named ones, else those it has)."""
    if columns:
        absent = [c for c in columns if c not in schema.fieldNames()]
        if absent:
            raise error(
                "SINK_ROUTED_COLUMNS_ABSENT",
                table=f"{spec.schema}.{spec.table}",
                columns=absent,
                fields=schema.fieldNames(),
            )
        schema = _only(schema, set(columns))
    if spec.create or spec.evolve:
        conn.commit()  # the DDL commits on its own, before any batch
        for change in evolve.prepare(conn, spec, schema):
            log.warning("sink %s: %s", spec.name, change)
    table = describe(conn, spec.schema, spec.table)
    if lane is not None and not columns:  # a routed table without columns=: the fields it has
        schema = _only(schema, set(table.columns))
    found = plan(schema, table, spec)
    return Lane(
        spec, found, Statements(spec, found, lane=lane), Statements(spec, found, in_task=True, lane=lane)
    )


def _only(schema: T.StructType, names: set[str]) -> T.StructType:
    """The frame's fields among `names`, with Kafka's own columns and the parse error."""
    kept = names | KAFKA_COLUMNS | {ERROR_COLUMN}
    return T.StructType([f for f in schema.fields if f.name in kept])


def _spec_keywords(table: Table) -> dict[str, Any]:
    """A routed table's own SinkSpec fields."""
    key = (table.key,) if isinstance(table.key, str) else tuple(table.key)
    return {
        "schema": table.schema,
        "key": key,
        "mode": table.mode,
        "version": table.version,
        "outbox": table.outbox,
        "create": table.create,
        "evolve": table.evolve,
    }


def _table_keywords(table: Table) -> dict[str, Any]:
    """A routed table's own PostgresSink keywords."""
    return {**_spec_keywords(table), "key": table.key, "delete": table.delete}


class BatchWriter:
    """Applies each micro-batch: in the tasks where the frame allows it, else staged then on the driver."""

    def __init__(
        self,
        spec: SinkSpec,
        frame: DataFrame,
        delete: Delete,
        kafka: Mapping[str, str] | None = None,
        checkpoint: str | None = None,
        routing: Routing | None = None,
    ) -> None:
        self.spec = spec
        self.checkpoint = checkpoint
        self._query: str | None = None
        if checkpoint is None and is_connect(frame):
            log.warning(
                "sink %s: on Spark Connect the writer reads the query's id in its checkpoint; without"
                " sink.writer(frame, checkpoint_location) it cannot check that PostgreSQL lost no batch",
                spec.name,
            )
        if routing is not None and isinstance(routing.by, str) and routing.by not in frame.columns:
            raise error("SINK_ROUTE_COLUMN_ABSENT", by=routing.by, columns=frame.columns)
        with connect(spec.url) as conn:
            used = (tables.SINK_PROGRESS, tables.SINK_DEAD_LETTERS, tables.SINK_BATCHES, tables.SINK_TOPICS)
            tables.require(
                conn, spec.url, spec.ledger_schema, used + ((tables.SINK_TRACES,) if spec.trace else ())
            )
            wanted = _wanted(spec, delete, routing)
            self.lanes = tuple(
                _lane(conn, frame.schema, lane_spec, rule, columns, None if routing is None else i)
                for i, (lane_spec, rule, columns) in enumerate(wanted)
            )
            self.plan, self.statements = self.lanes[0].plan, self.lanes[0].statements
            self._stage_jobs = tuple(self._job(conn, lane, lane.statements) for lane in self.lanes)
            in_task = tuple((self._job(conn, lane, lane.in_task), lane.in_task) for lane in self.lanes)
            lanes = None
            if routing is not None:
                widths = tuple(len(lane.plan.columns) for lane in self.lanes)
                lanes = Lanes(tuple(routing.tables), widths, routing.unrouted, routing.described)
            self._task_job = TaskJob(*in_task[0], lanes=lanes, tables=in_task if lanes else ())
            self._drop_stale_stage(conn)
            for lane in self.lanes:
                self._warn_emptied(conn, lane)
            if pooled(conn):
                log.warning(
                    "sink %s: PostgreSQL is reached through a connection pooler: in transaction mode the"
                    " sink's lock, one query a sink at a time, does not hold (session mode does)",
                    spec.name,
                )
        # Built once: each is a call into the JVM (or a proto), and a batch would pay them all again.
        for (_, rule, _), lane in zip(wanted, self.lanes, strict=True):
            if direct.tombstones(rule) and lane.plan.raw_value is None:
                log.warning(
                    "sink %s: delete='tombstone' reads Kafka's binary `value` column, which the frame does"
                    " not have (cast to text or dropped): no record deletes its key, and a tombstone"
                    " upserts it with empty columns. Keep `value` as Kafka gives it, or pass delete=None"
                    " or a rule",
                    spec.name,
                )
        rules = [_delete_rule(rule, lane.plan) for (_, rule, _), lane in zip(wanted, self.lanes, strict=True)]
        if routing is None:
            self._columns = staged_columns(self.plan, rules[0])
            probe = frame.select("*", rules[0].alias("_delete"))
        else:
            self._columns = routed_columns([lane.plan for lane in self.lanes], rules, routing.column())
            probe = frame.select(
                "*", *(r.alias(f"_delete{i}") for i, r in enumerate(rules)), routing.column()
            )
        # Proven with the delete rules and the route, which the tasks compute too: a window is a shuffle.
        root, position = read_plan(probe)
        self.route = choose(root, position, spec.apply_in)
        self._topics = TopicCheck(root, kafka or {}, spec.name, spec.ledger_schema)
        self._topics.check_ledgers(spec.url)
        self.last: BatchResult | None = None
        log.info("sink %s %s", spec.name, self.route)
        self._schema: Any = None
        self._declined_whole = 0
        self.reads_kafka = self._reads_kafka(frame, delete)

    def _reads_kafka(self, frame: DataFrame, delete: Delete) -> direct.DirectJob | None:
        """The job of tasks that read the batches' Kafka records themselves (direct.py), if they can."""
        values, connect = direct.values_of(frame), is_connect(frame)
        if not self.spec.read_kafka:
            why: str | None = "read_kafka=False"
        elif self._task_job.lanes is not None:
            why = "a routed sink's tasks take Spark's rows"
        else:
            source = read_plan(values.source)[0] if values is not None and not connect else None
            why = direct.why_not(values, self.plan, delete, self.route, source, connect)
        if why is not None or values is None or self._topics.options is None:
            log.info("sink %s: its tasks take the batches' rows from Spark: %s", self.spec.name, why)
            return None
        log.info("sink %s: its tasks read the batches' Kafka records themselves", self.spec.name)
        self._schema = frame.schema
        parse = direct.parse_for(values, self.plan, delete)
        return direct.DirectJob(self._task_job, parse, self._topics.options, waits=True)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Apply the batch; on a lost connection or an unreachable server, all over again (the
        ledger skips what a first try applied) for up to the spec's `retry_for`, so a query
        outlives a blip of the network or a PostgreSQL restart instead of failing."""

        def once() -> BatchResult:
            if self.route.tasks:
                return self.apply_in_tasks(batch, batch_id)
            return self.apply(self.stage(batch, batch_id))

        with_retries(once, self.spec.retry_for, f"sink {self.spec.name}, batch {batch_id}")

    # -- in the tasks ----------------------------------------------------------------------------------

    def apply_in_tasks(self, batch: DataFrame, batch_id: int) -> BatchResult:
        """Each task applies its topic-partitions' rows in a transaction of its own, ledger included.

        The batch is recorded once every task committed, in a later commit: a
        database that still shows it still holds every task's commit.
        """
        query = self.query_id(batch)
        with self.exclusive() as conn:
            self._check(conn, query, batch_id)
            done = self._run_tasks(batch, (query, batch_id) if query else None)
            result = self.summarize(batch_id, done)
            ends = {(e.topic, e.partition): e.offset for task in done for e in task.ends}
            self._record_after_tasks(conn, query, result, ends)
        return result

    def _record_after_tasks(
        self, conn: psycopg.Connection, query: str | None, result: BatchResult, ends: Positions
    ) -> None:
        """Record the batch and its outcome once the ledger shows every task's commit (continuity.
        behind); if PostgreSQL restarted under the batch (its tasks retried), on a new session."""

        def record(conn: psycopg.Connection) -> list[tuple[str, int]]:
            """The topic-partitions whose commit is gone; the batch recorded if none."""
            gone = behind(positions(conn, self.spec.ledger_schema, self.spec.name), ends)
            if not gone and query:
                conn.execute(self.statements.record_batch(), self._batch(query, result.batch_id))
                self._report(conn, query, result)
            return gone

        try:
            with self.watched(conn):
                gone = record(conn)
        except MOMENTARY:  # the connection lost, not the verdict: that is raised once, below
            with self._connect() as again, self.watched(again):
                gone = record(again)
        if gone:
            which = ", ".join(f"{t}-{p}" for t, p in gone)
            raise error("SINK_TASK_COMMIT_LOST", sink=self.spec.name, batch=result.batch_id, partitions=which)

    def _report(self, conn: psycopg.Connection, query: str, result: BatchResult) -> None:
        """The batch's outcome beside its record, where a Spark Connect client reads `sink.last`."""
        params = {**self._batch(query, result.batch_id), "result": json.dumps(asdict(result))}
        conn.execute(self.statements.report_batch(), params)

    def tasks(self, batch: DataFrame, after: tuple[str, int] | None = None) -> DataFrame:
        """The batch's tasks, one result row each once its transaction committed; lazy until collected.

        after: (query, batch id), whose batch before the database must still show as each task
        commits (continuity.check)."""
        job = replace(self._task_job, after=after)
        return batch.select(*self._columns).mapInArrow(applier(job), TASK_RESULT)

    def _run_tasks(self, batch: DataFrame, after: tuple[str, int] | None) -> list[Row]:
        """The batch's tasks' rows: read from Kafka by the tasks where they can, else from Spark's rows;
        the topic-partitions of a reading task that declined are applied from Spark's rows of them."""
        if self.reads_kafka is None:
            return self.tasks(batch, after).collect()
        # The frame this writer was made for, as its batches are: read_kafka trusts nothing after it.
        planned = planned_tasks(batch) if batch.schema == self._schema else None
        job = direct.for_batch(self.reads_kafka, planned, after) if planned else None
        if job is None:
            if planned != []:
                self._read_no_more(
                    "the batch's offset ranges cannot be read, or its frame is not the writer's"
                )
            return self.tasks(batch, after).collect()
        tasks = batch.sparkSession.range(0, len(job.tasks), 1, len(job.tasks))
        done = tasks.mapInArrow(direct.reader(job), TASK_RESULT).collect()  # a row a task, in order
        declined = [(ranges, d.declined) for ranges, d in zip(job.tasks, done, strict=True) if d.declined]
        self._declined_whole = self._declined_whole + 1 if len(declined) == len(done) else 0
        if not declined:
            return done
        pairs = [(r.topic, r.partition) for ranges, _ in declined for r in ranges]
        read = sum(len(ranges) for ranges in job.tasks)
        log.warning(
            "sink %s: %d of %d topic-partitions applied from Spark's rows, not read by the tasks: %s",
            self.spec.name,
            len(pairs),
            read,
            declined[0][1],
        )
        if self._declined_whole >= _DECLINED_WHOLE:
            self._read_no_more(f"its tasks declined every range of {_DECLINED_WHOLE} batches in a row")
        if len(pairs) == read:  # Spark's rows of them all: no filter to build
            return self.tasks(batch, after).collect()
        wanted = F.struct(F.col("topic"), F.col("partition"))
        only = wanted.isin([F.struct(F.lit(t), F.lit(p)) for t, p in pairs])
        return [d for d in done if not d.declined] + self.tasks(batch.where(only), after).collect()

    def _read_no_more(self, why: str) -> None:
        log.warning("sink %s: %s; its tasks take Spark's rows from now on", self.spec.name, why)
        self.reads_kafka = None

    def summarize(self, batch_id: int, done: list[Row]) -> BatchResult:
        """The batch's result from its tasks' rows; a task's refusal fails the batch with its line."""
        refused = [r for r in done if r.refused]
        if refused:  # raised again as the task raised it: its message and code
            raise SinkError(refused[0].refused, code=refused[0].refused_code)
        counts = {c: sum(getattr(r, c) for r in done) for c in COUNTS}
        stages = {stage: sum(getattr(r, t) for r in done) for stage, t in zip(STAGES, TIMES, strict=True)}

        def slowest(*parts: str) -> float:
            return max((sum(getattr(r, f"{p}_seconds") for p in parts) for r in done), default=0.0)

        staging, applying = slowest("encode", "copy"), slowest("lock", "apply", "commit")
        self.last = BatchResult(
            batch_id, **counts, stage_seconds=staging, apply_seconds=applying, stages=stages
        )
        log.info("sink %s: %s", self.spec.name, self.last)
        return self.last

    @contextmanager
    def exclusive(self) -> Iterator[psycopg.Connection]:
        """Hold the sink's advisory lock: one query writes a sink at a time."""
        with self._connect() as conn:
            with self.watched(conn):
                self._lock(conn)
            try:
                yield conn
            finally:
                with suppress(ServiceUnavailable, psycopg.Error), self.watched(conn):
                    _unlock(conn)

    def _connect(self) -> psycopg.Connection:
        """The driver's connection: its kernel gives up on a server gone silent (a partition, a host
        lost in a failover) in about `database_timeout`, as the tasks' do."""
        return connect(self.spec.url, autocommit=True, settings=keepalive(self.spec.database_timeout))

    @contextmanager
    def watched(self, conn: psycopg.Connection) -> Iterator[None]:
        """What the driver asks on a connection that waited idle while the executors worked, dropped
        if the server stops working for it (outbox.core.postgres.watched): a proxy's partition,
        which keepalives do not see, held the batch for ever, after its tasks had moved to the
        server a failover made primary."""
        if conn.closed:
            yield
            return
        with watched(conn, self.spec.url, self.spec.database_timeout):
            yield

    # -- staged, then on the driver ----------------------------------------------------------------------

    def stage(self, batch: DataFrame, batch_id: int) -> Staged:
        """Copy the batch into the stage table from the executors; nothing is applied yet.

        Takes the sink's advisory lock until `apply` ends: two queries writing one
        sink would share its stage table, so the second one fails at once instead.
        """
        start, query = time.perf_counter(), self.query_id(batch)
        conn = self._connect()
        try:
            with self.watched(conn):
                self._lock(conn)
            self._check(conn, query, batch_id)
        except BaseException:
            conn.close()  # the stage table is the other writer's: leave it alone
            raise
        try:
            with self.watched(conn):
                for lane in self.lanes:
                    conn.execute(lane.statements.create_stage())
            token = secrets.randbits(31)
            jobs = [replace(job, token=token) for job in self._stage_jobs]
            stage = stager(jobs, self.spec, self._task_job.lanes)
            tasks = batch.select(*self._columns).mapInArrow(stage, RESULT_SCHEMA).collect()
        except BaseException:
            _drop_stage(conn, self.lanes)
            raise
        attempts, rows = [t.attempt for t in tasks], sum(t.staged for t in tasks)
        ends = moved(t.ends for t in tasks) if self._task_job.lanes is not None else None
        seconds, ignored = time.perf_counter() - start, sum(t.ignored for t in tasks)
        return Staged(batch_id, attempts, rows, conn, seconds, query, ends, ignored)

    def apply(self, staged: Staged) -> BatchResult:
        """Apply a staged batch in one transaction with the ledger; a replay changes nothing."""
        start = time.perf_counter()
        try:
            with self.watched(staged.conn):
                result = apply_batch(
                    staged.conn,
                    [lane.statements for lane in self.lanes],
                    staged.batch_id,
                    staged.attempts,
                    staged.rows,
                    self._batch(staged.query, staged.batch_id) if staged.query else None,
                    staged.ends,
                )
        except BaseException:
            _drop_stage(staged.conn, self.lanes)  # a failed batch leaves nothing behind
            raise
        took = time.perf_counter() - start
        self.last = replace(result, stage_seconds=staged.seconds, apply_seconds=took, ignored=staged.ignored)
        with staged.conn, self.watched(staged.conn):
            if staged.query:
                self._report(staged.conn, staged.query, self.last)
            _unlock(staged.conn)
        log.info("sink %s: %s", self.spec.name, self.last)
        return self.last

    def _job(self, conn: psycopg.Connection, lane: Lane, st: Statements) -> StageJob:
        """What a task needs to COPY into `st`'s stage; token set per batch run."""
        return StageJob(
            copy_rows=st.copy_rows().as_bytes(conn),
            copy_dead=st.copy_dead().as_bytes(conn),
            keys=tuple(lane.plan.columns.index(k) for k in lane.spec.key),
            names=lane.plan.columns,
            token=0,
        )

    def query_id(self, batch: DataFrame) -> str | None:
        """The streaming query's id. On Spark Connect read once from the checkpoint: the server
        unpickles this writer for each run of the query, so it serves one query only."""
        if self._query is None:
            found = query_id(batch, self.checkpoint)
            if not is_connect(batch):
                return found
            self._query = found
        return self._query

    def _check(self, conn: psycopg.Connection, query: str | None, batch_id: int) -> None:
        """Before a batch: the database lost no batch before it (continuity.py), and the ledger's
        offsets are of the topics Kafka has now (topics.py). Only the first is watched: the second
        waits on Kafka too, and a Kafka stall would leave the session idle long enough to be taken
        for a lost one."""
        with self.watched(conn):
            continuity.check(conn, self.statements, query, batch_id)
        self._topics(conn)

    def _warn_emptied(self, conn: psycopg.Connection, lane: Lane) -> None:
        """Say so when the lane's table is empty while the ledger says the sink applied offsets."""
        if not _emptied(conn, lane.statements):
            return
        progress = sql.Identifier(self.spec.ledger_schema, tables.SINK_PROGRESS).as_string(conn)
        log.warning(
            "sink %s: %s.%s is empty, but the sink's ledger says it applied offsets to it, and"
            " skips them: to rebuild the table from the topic, DELETE FROM %s WHERE sink = %s"
            " and start the query from earliest with a new checkpoint (if the sink's own"
            " deletes emptied it, nothing is amiss)",
            self.spec.name,
            lane.spec.schema,
            lane.spec.table,
            progress,
            sql.Literal(self.spec.name).as_string(conn),
        )

    def _drop_stale_stage(self, conn: psycopg.Connection) -> None:
        """Drop the stage tables a killed staged batch left, unless a live query holds the sink."""
        if scalar(conn.execute(f"SELECT pg_try_advisory_xact_lock({_LOCK_KEY})", [self.spec.name])):
            for lane in self.lanes:
                conn.execute(lane.statements.drop_stage())

    def _batch(self, query: str, batch_id: int) -> dict[str, Any]:
        return {"sink": self.spec.name, "query": query, "batch": batch_id}

    def _lock(self, conn: psycopg.Connection) -> None:
        locked = conn.execute(f"SELECT pg_try_advisory_lock({_LOCK_KEY})", [self.spec.name]).fetchone()
        if not locked or not locked[0]:
            raise error("SINK_IN_USE", sink=self.spec.name)


_LOCK_KEY = "hashtextextended('outbox-sink:' || %s, 0)"
# Batches in a row whose every range the reading tasks declined (values past Spark's parser's limits,
# say): each was read twice, so the tasks stop reading them.
_DECLINED_WHOLE = 3


def _emptied(conn: psycopg.Connection, st: Statements) -> bool:
    """statements.emptied, as advice: a table locked (a TRUNCATE not yet committed) or slow to
    scan (the dead rows of a DELETE) is passed over, not waited for."""
    try:
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '1s'; SET LOCAL statement_timeout = '5s'")
            return bool(scalar(conn.execute(st.emptied(), {"sink": st.spec.name})))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled):
        return False


def _drop_stage(conn: psycopg.Connection, lanes: Sequence[Lane]) -> None:
    """Drop the stage tables, if the connection still works, and close it, the lock freed."""
    try:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            for lane in lanes:
                conn.execute(lane.statements.drop_stage())
    except psycopg.Error as exc:
        log.warning("sink %s: could not drop the stage table: %s", lanes[0].spec.name, exc)
    finally:
        _unlock(conn)
        conn.close()


def _unlock(conn: psycopg.Connection) -> None:
    """Free the sink's advisory lock now, where the connection still works. Closing it frees the lock
    only once the server's backend has ended, a moment later: Spark's replay of a failed batch, or
    the next batch, could meet the lock still held and stop as SINK_IN_USE (a busy host did)."""
    with suppress(psycopg.Error):
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.execute("SELECT pg_advisory_unlock_all()")


def staged_columns(plan: Plan, delete: Column) -> list[Column]:
    """The columns the stager copies: data as c0..cN, then position, delete flag, raw record, parse error."""
    return [*_data(plan), *_position(), F.coalesce(delete, F.lit(False)).alias("_delete"), *_kept(plan)]


def routed_columns(plans: Sequence[Plan], deletes: Sequence[Column], route: Column) -> list[Column]:
    """A routed sink's: each lane's data as l{i}_c0..l{i}_cN and delete flag, then the columns the
    lanes share, then the route (routing.Lanes.split takes each lane's rows from these)."""
    lanes = [
        column
        for i, (plan, delete) in enumerate(zip(plans, deletes, strict=True))
        for column in (
            *_data(plan, f"l{i}_"),
            F.coalesce(delete, F.lit(False)).alias(f"l{i}_delete"),
        )
    ]
    return [*lanes, *_position(), *_kept(plans[0]), route]


def _data(plan: Plan, prefix: str = "") -> list[Column]:
    return [_convert(_col(n), plan.conversions[n]).alias(f"{prefix}c{i}") for i, n in enumerate(plan.columns)]


def _position() -> list[Column]:
    return [
        F.col("topic").alias("_topic"),
        F.col("partition").alias("_partition"),
        F.col("offset").alias("_offset"),
    ]


def _kept(plan: Plan) -> list[Column]:
    """The raw record, for dead letters, and the parse error."""
    raw = [
        (_col(name) if name else F.lit(None).cast("binary")).alias(alias)
        for name, alias in ((plan.raw_key, "_raw_key"), (plan.raw_value, "_raw_value"))
    ]
    return [*raw, (_col(plan.error) if plan.error else F.lit(None).cast("string")).alias("_parse_error")]


# Spark's to_json writes times to the millisecond unless told: microseconds, as Spark holds them;
# in UTC, for in the session's zone an offset with seconds (most zones before 1900) lost them to
# the format's minutes, and the instant moved. And it leaves a null field out unless told:
# {"a": null} is no {}.
_TO_JSON = {
    "timeZone": "UTC",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "ignoreNullFields": "false",
}


def _col(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _convert(column: Column, how: Conversion) -> Column:
    if how == "hex":
        return F.concat(F.lit("\\x"), F.hex(column))
    if how == "json":
        return F.to_json(column, _TO_JSON)
    if how == "integral":  # 3.00 is written as 3; 2.5 stays as it is, and the table refuses it
        # Through a long: exact for a double too (Spark's cast to decimal goes through its shortest
        # text: 2**60 became ...980). Past a long's range (floor() overflowed there, failing the batch
        # and every replay of it; try_cast gives 2**63 as 2**63 - 1) the value goes as text, and the
        # table refuses it. Decimal bounds: compared exactly with a decimal, and as doubles with a double.
        in_range = (column >= F.lit(Decimal(-(2**63)))) & (column < F.lit(Decimal(2**63)))
        return F.when((column % 1 == 0) & in_range, column.cast("long").cast("string")).otherwise(
            column.cast("string")
        )
    if how == "array":  # a PostgreSQL array literal: {"a","b\"c",NULL}

        def quote(x: Column) -> Column:
            text = F.regexp_replace(F.regexp_replace(x.cast("string"), r"\\", r"\\\\"), '"', r'\\"')
            return F.concat(F.lit('"'), text, F.lit('"'))

        return F.concat(F.lit("{"), F.array_join(F.transform(column, quote), ",", "NULL"), F.lit("}"))
    return column


def _delete_rule(delete: Delete, plan: Plan) -> Column:
    if delete is None:
        return F.lit(False)
    if isinstance(delete, Column):
        return delete
    if delete == "tombstone":
        return _col(plan.raw_value).isNull() if plan.raw_value else F.lit(False)
    return F.expr(delete)
