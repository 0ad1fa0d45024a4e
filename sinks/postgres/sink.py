"""The user-facing sink: validate at start, then stage and apply each micro-batch.

PostgresSink is the public entry; the BatchWriter it starts the query with is writer.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql.streaming import StreamingQuery

from outbox.core.config import database_url, schema_name
from outbox.core.postgres import connect
from sinks.errors import error
from sinks.postgres import settings as S
from sinks.postgres.apply import BatchResult
from sinks.postgres.columns import delete_rule, staged_columns
from sinks.postgres.lanes import spec_keywords, table_keywords
from sinks.postgres.metrics import SinkMetrics
from sinks.postgres.placement import ApplyIn, Route
from sinks.postgres.retry import start_query
from sinks.postgres.routing import Delete, Routing, Table, Unrouted
from sinks.postgres.settings import Mode, OnError, Outbox
from sinks.postgres.spec import SinkSpec
from sinks.postgres.writer import BatchWriter

# BatchWriter and staged_columns are imported from here too, as before they had modules of their own.
__all__ = ["BatchWriter", "PostgresSink", "staged_columns"]

# The tests' name for columns.delete_rule, from when it was private to this module.
_delete_rule = delete_rule


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
        Kafka source and is applied in the tasks, the tasks read each batch's
        records from Kafka themselves and parse them (sinks/postgres/direct.py).
        JSON is parsed with Arrow, except in a range that Arrow could parse
        differently from Spark, which takes Spark's rows instead. Spark's
        progress then counts no input rows. With False, the tasks always take
        Spark's rows.

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
            **table_keywords(first),
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
            replace(sink.spec, table=table.name, **spec_keywords(table))
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
