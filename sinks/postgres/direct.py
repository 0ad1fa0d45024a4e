"""Tasks that read Kafka themselves, where the frame is a parse_* of a Kafka source.

From Kafka, most of the sink's CPU per event was Spark's: its source, its
from_json and its hand-off to Python as Arrow (bench/sink.py). Where the frame
is exactly what parse_json made of kafka_rc or Spark's own Kafka source, with
nothing after it, each task reads the offset ranges Spark planned for it, read
committed (sinks/kafka_source/reader.py), parses its values with Arrow's JSON
reader, and applies them as any task does (task.py): the same rows, ledger and
transaction, without Spark between Kafka and the task.

Avro and Protobuf (parse_avro, parse_protobuf) are decoded in the task by the
very decoder Spark's Python workers run (decoded.py), so their rows are the
same by construction, and a value it cannot read is a dead letter, as there.

Arrow's parse is trusted only where it gives what Spark's from_json gives
(`staged`): a range holding any record it cannot vouch for, or whose read
fails, is declined, and applied from Spark's own rows of it, as before.
`why_not` says, at start, why a frame is read Spark's way.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql import types as T

from sinks.kafka_source.options import SourceOptions
from sinks.kafka_source.ranges import Range
from sinks.kafka_source.reader import ARROW_SCHEMA
from sinks.kafka_source.source import read_ranges
from sinks.postgres.clock import Clock
from sinks.postgres.decoded import Decoder
from sinks.postgres.placement import Node, Route
from sinks.postgres.plan import ERROR_COLUMN, Plan
from sinks.postgres.task import NOTHING, TaskJob, apply_records, result

# The types whose JSON Arrow reads as Spark's from_json does, or refuses (FloatType is parsed as a
# float by Spark and as a double then narrowed by Arrow; times and nested types by rules of their own).
_TYPES: dict[type, pa.DataType] = {
    T.StringType: pa.string(),
    T.LongType: pa.int64(),
    T.IntegerType: pa.int32(),
    T.DoubleType: pa.float64(),
    T.BooleanType: pa.bool_(),
}
# Of a Kafka record's columns, those the tasks can write as Spark's source gives them.
_KAFKA = ("topic", "partition", "offset")
_CORRUPT = "_corrupt_record"  # parse_json's own: a value that holds it is Spark's to judge
_WHITESPACE = " \t"  # JSON's, but for the line breaks no value may hold here
_LINE_BREAK = "[\n\r]"
# A NaN or Infinity token, which Arrow reads (Inf too) and Spark's parser by rules of its own; in a
# string that only looks like one, the range is declined for nothing.
_NON_FINITE = r"[:,\[][ \t]*[-+]?(?:Inf|NaN)"
# Spark's parser (Jackson) refuses a number of over 1,000 characters, nesting over 1,000 deep, a
# name of over 50,000: Arrow reads them. Only a value this long can hold one, and is looked into.
_LONG = 1_000
_LONGEST = 50_000  # declined whole


@dataclass(frozen=True)
class Parsed:
    """What parse_json, parse_avro or parse_protobuf was asked, kept on the frame it returned."""

    source: Any  # the Kafka source's frame it parsed
    schema: T.StructType
    key_column: str | None
    key_format: str
    options: dict[str, Any] | None  # parse_json's
    decoder: Decoder | None = None  # parse_avro's and parse_protobuf's; None: JSON


_MARK = "_outbox_parsed"
# The pyarrow whose JSON reader tests/integration/test_sink_direct.py holds to Spark's parse: what
# another one accepts (decimals as text, Inf, duplicate fields) may differ, so it reads nothing.
_CHECKED_ARROW = "26"


def checked_arrow() -> bool:
    return str(pa.__version__).split(".")[0] == _CHECKED_ARROW


def tombstones(delete: object) -> bool:
    """Whether the delete rule is the tombstone one (a Column is compared with `isinstance` first:
    its `==` makes another Column)."""
    return isinstance(delete, str) and delete == "tombstone"


_Frame = TypeVar("_Frame")


def remember(frame: _Frame, values: Parsed) -> _Frame:
    """Mark `frame` as a parse_*'s own; a step after it makes another frame, unmarked."""
    setattr(frame, _MARK, values)
    return frame


def arrow_type(kind: T.DataType) -> pa.DataType | None:
    if isinstance(kind, T.DecimalType):
        return pa.decimal128(kind.precision, kind.scale)
    return _TYPES.get(type(kind))


def values_of(frame: Any) -> Parsed | None:
    """What the parse_* that made this very frame was asked, if one did."""
    found = getattr(frame, _MARK, None)
    return found if isinstance(found, Parsed) else None


def why_not(
    values: Parsed | None, plan: Plan, delete: object, route: Route, source: Node | None, connect: bool
) -> str | None:
    """Why the tasks cannot read the frame's Kafka records themselves; None if they can.

    values: values_of(frame); source: the plan of the frame it parsed (spark_plan.read_plan)."""
    if connect:
        return "on Spark Connect a batch's offset ranges are the server's"
    if values is None:
        return "the frame is not a parse_*'s own (a step after it, or a parse of another's)"
    if not route.tasks:
        return route.why
    if source is None or source.children or source.source not in ("kafka", "kafka_rc"):
        return "the parse did not read a Kafka source directly"
    if values.options:
        return "parse_json was given options, which Spark's parse applies"
    if values.key_column and (
        values.key_format != "text" or values.schema[values.key_column].dataType != T.StringType()
    ):
        return "a tombstone's key is read as a type, as JSON or as Avro, not as its text"
    if delete is not None and not tombstones(delete):
        return "the delete rule is an expression for Spark to compute"
    if values.decoder is None and not checked_arrow():
        return f"pyarrow {pa.__version__}'s JSON reader is not the one held to Spark's ({_CHECKED_ARROW})"
    fields = {f.name: f.dataType for f in values.schema.fields}
    other = [n for n in plan.columns if (n in fields and arrow_type(fields[n]) is None)]
    other += [n for n in plan.columns if n not in fields and n not in _KAFKA]
    other += [n for n in plan.columns if plan.conversions[n] != "native"]
    if other:
        named = ", ".join(dict.fromkeys(other))
        return f"column(s) {named} are not of a type read here as written (text, numbers, booleans)"
    return None


@dataclass(frozen=True)
class Parse:
    """How a task makes a range's records into the columns the sink's tasks take (columns.staged_columns)."""

    fields: pa.Schema  # the value's fields, as Arrow reads them (parse_json's corrupt column too)
    columns: tuple[str, ...]  # the data columns: a field's name, or a Kafka column's
    tombstones_delete: bool  # delete='tombstone'
    key_column: str | None  # a text column a tombstone takes from its Kafka key
    raw_key: bool  # the frame keeps the raw key and value (for dead letters)
    raw_value: bool
    decoder: Decoder | None = None  # Avro's or Protobuf's; None: JSON, read by Arrow


def parse_for(values: Parsed, plan: Plan, delete: object) -> Parse:
    """The Parse of a frame `why_not` passed."""
    fields = [pa.field(f.name, arrow_type(f.dataType)) for f in values.schema.fields]
    return Parse(
        fields=pa.schema([*fields, pa.field(_CORRUPT, pa.string())]),
        columns=plan.columns,
        tombstones_delete=tombstones(delete),
        key_column=values.key_column,
        raw_key=plan.raw_key is not None,
        raw_value=plan.raw_value is not None,
        decoder=values.decoder,
    )


@dataclass(frozen=True)
class DirectJob:
    """What a reading task needs, pickled to the executors."""

    task: TaskJob
    parse: Parse
    source: SourceOptions  # how the frame's source reads: librdkafka's settings, its timeouts
    waits: bool  # kafka_rc's read waits out a Kafka without a leader; Spark's fails at pollTimeoutMs
    tasks: tuple[tuple[Range, ...], ...] = ()  # set per batch: each task's ranges, as Spark planned them


# What spark_plan.planned_tasks reads of a task's input partition: Spark's Kafka source's range (topic,
# partition, from, until, pollTimeoutMs, failOnDataLoss), or a Python data source's pickled partition.
Planned = tuple[str, Any]


def for_batch(job: DirectJob, planned: list[Planned], after: tuple[str, int] | None) -> DirectJob | None:
    """The job of one batch's tasks, as Spark planned them; None where they are not Kafka ranges."""
    kinds = {kind for kind, _ in planned}
    task = replace(job.task, after=after)
    if kinds == {"kafka"}:
        given = [p for _, p in planned]
        polls, losses = {p[4] for p in given}, {p[5] for p in given}
        one_each = len({p[:2] for p in given}) == len(given)  # a topic-partition split over tasks: no
        if len(polls) != 1 or len(losses) != 1 or not one_each or any(not 0 <= p[2] <= p[3] for p in given):
            return None
        poll_s = polls.pop() / 1000
        source = replace(job.source, poll_timeout_s=poll_s, fail_on_data_loss=losses.pop())
        tasks = tuple((Range(*p[:4]),) for p in given)
        return replace(job, task=task, source=source, waits=False, tasks=tasks)
    if kinds == {"python"}:  # kafka_rc's stream: its reads wait out a Kafka without a leader
        try:  # kafka_rc's own partitions, unpickled as Spark's executors unpickle them
            values = [pickle.loads(p).value or () for _, p in planned]
        except Exception:  # not ours after all: Spark's rows
            return None
        if not all(isinstance(r, Range) for v in values for r in v):
            return None
        return replace(job, task=task, waits=True, tasks=tuple(tuple(v) for v in values))
    return None


class Declined(Exception):
    """Records the tasks do not vouch for parsing as Spark does."""


def staged(records: pa.Table, parse: Parse) -> pa.RecordBatch:
    """A range's Kafka records as the columns columns.py's staged_columns gives the tasks: decoded by the
    frame's own decoder (Avro, Protobuf), or parsed by Arrow as Spark's from_json (PERMISSIVE)
    would; Declined where that is not certain.

    Arrow and Spark differ on input Spark reads and Arrow refuses (single quotes, a string of
    digits for a number), which is declined, and on some Arrow takes that Spark reads otherwise:
    a value of two JSON texts, a decimal past its precision, -0 as a double (Spark reads an
    integer's -0 as 0.0), Inf and NaN, a value past Jackson's limits, a value holding parse_json's
    corrupt-record field. Those are looked for here, loosely: a needless decline costs only speed.
    """
    n = records.num_rows
    column = {name: _one(records.column(name)) for name in ("key", "value", *_KAFKA)}
    value = column["value"]
    present = pc.is_valid(value)
    if parse.decoder is None:
        parsed, errors = _json(value, present, parse.fields), pa.nulls(n, pa.string())
    else:
        decoded = pa.Table.from_batches(list(parse.decoder(iter(records.to_batches()))))
        parsed = decoded.select(parse.decoder.fields.names)
        errors = _one(decoded.column(ERROR_COLUMN))
    # a tombstone's key column is its key's text
    if parse.key_column is not None and value.null_count:
        try:
            key = pc.if_else(present, pa.scalar(None, pa.binary()), column["key"]).cast(pa.string())
        except pa.ArrowInvalid as exc:
            raise Declined("a tombstone's key is not UTF-8") from exc
        chosen = pc.if_else(present, parsed.column(parse.key_column), key)
        parsed = parsed.set_column(parsed.schema.get_field_index(parse.key_column), parse.key_column, chosen)
    kafka = {name: column[name] for name in _KAFKA}
    data = [parsed.column(c) if c in parse.fields.names else kafka[c] for c in parse.columns]
    delete = pc.invert(present) if parse.tombstones_delete else pa.repeat(False, n)
    nothing = pa.nulls(n, pa.binary())
    columns = [
        *data,
        kafka["topic"],
        kafka["partition"],
        kafka["offset"],
        delete,
        column["key"] if parse.raw_key else nothing,
        value if parse.raw_value else nothing,
        errors,  # a row's error (Avro, Protobuf): it is dead-lettered; JSON's decline the range
    ]
    names = [*(f"c{i}" for i in range(len(data))), "_topic", "_partition", "_offset", "_delete"]
    names += ["_raw_key", "_raw_value", "_parse_error"]
    return pa.Table.from_arrays([_one(c) for c in columns], names).combine_chunks().to_batches()[0]


def _json(value: pa.Array, present: pa.Array, fields: pa.Schema) -> pa.Table:
    """The values parsed as JSON; a tombstone's fields null, as from_json(null) gives."""
    held = value.filter(present)
    try:
        text = held.cast(pa.string())  # Spark's JSON parser refuses what is not UTF-8
    except pa.ArrowInvalid as exc:
        raise Declined("a value is not UTF-8") from exc
    parsed = _parse(text, fields)
    if len(held) < len(value):
        at = pc.subtract(pc.cumulative_sum(present.cast(pa.int64())), 1)
        parsed = parsed.take(pc.if_else(present, at, pa.scalar(None, pa.int64())))
    return parsed


def _one(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _parse(text: pa.Array, fields: pa.Schema) -> pa.Table:
    if not checked_arrow():  # an executor's pyarrow may not be the driver's
        raise Declined(f"pyarrow {pa.__version__} is not the one checked against Spark's parse")
    if len(text) == 0:
        return fields.empty_table().select(fields.names[:-1])
    if pc.any(pc.match_substring_regex(text, f"{_LINE_BREAK}|{_NON_FINITE}")).as_py():  # one pass for both
        if pc.any(pc.match_substring_regex(text, _LINE_BREAK)).as_py():
            raise Declined("a value holds a line break")  # the reader takes one value a line
        raise Declined("a value holds NaN or Infinity, which Spark's parser reads by rules of its own")
    trimmed = pc.utf8_trim(text, _WHITESPACE)
    if not pc.all(pc.starts_with(trimmed, "{")).as_py() or not pc.all(pc.ends_with(trimmed, "}")).as_py():
        raise Declined("a value is not a JSON object")
    long = text.filter(pc.greater_equal(pc.binary_length(text), _LONG))
    if len(long) and _past_limits(long):
        raise Declined(
            "a value is past a limit of Spark's parser (a number's length, nesting, a name's length)"
        )
    lines = pc.binary_join_element_wise(text, "", "\n")  # each value and a line break, in one buffer
    data = _joined(lines)
    try:
        table = pajson.read_json(
            pa.BufferReader(data),
            read_options=pajson.ReadOptions(use_threads=False, block_size=max(data.size, 1) + 1),
            parse_options=pajson.ParseOptions(explicit_schema=fields, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        said = str(exc).splitlines()[0]
        # Logged: "Failed to convert JSON to int64, couldn't parse:<the value>" without the value.
        raise Declined(said.split(":")[0] if said.startswith("Failed to convert") else said) from exc
    if table.num_rows != len(text):
        raise Declined("a value holds more than one JSON text")
    if table.column(_CORRUPT).null_count != table.num_rows:
        raise Declined(f"a value holds a field {_CORRUPT!r}")
    for field in fields:
        column = table.column(field.name)
        if pa.types.is_decimal(field.type):
            largest = (
                Decimal(10) ** (field.type.precision - field.type.scale) - Decimal(10) ** -field.type.scale
            )
            if pc.any(pc.greater(pc.abs(column), pa.scalar(largest, field.type))).as_py():
                raise Declined(f"field {field.name!r} is past {field.type}'s precision")
        if pa.types.is_floating(field.type):
            zero = pc.and_(pc.equal(column, 0.0), pc.less(pc.divide(1.0, column), 0.0))
            if pc.any(zero).as_py():
                raise Declined(f"field {field.name!r} is -0")
    return table.select(fields.names[:-1])


def _past_limits(long: pa.Array) -> bool:
    """Whether a long value may be past a limit of Jackson's (StreamReadConstraints' defaults); counted
    loosely, so that only declines too many."""
    if pc.any(pc.greater_equal(pc.binary_length(long), _LONGEST)).as_py():
        return True
    if pc.any(pc.match_substring_regex(long, f"[0-9.eE+-]{{{_LONG}}}")).as_py():
        return True
    opened = pc.add(pc.count_substring(long, "{"), pc.count_substring(long, "["))
    return bool(pc.any(pc.greater_equal(opened, _LONG)).as_py())


def _joined(lines: pa.Array) -> pa.Buffer:
    """A string array's bytes, end to end, without a copy into Python."""
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset : lines.offset + len(lines) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    return lines.buffers()[2].slice(start, end - start)


def reader(job: DirectJob) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task over the rows of spark.range: each row the index of the task whose ranges it reads and
    applies, in one transaction, as Spark's task would have."""

    def apply(indices: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in indices:
            for i in batch.column(0).to_pylist():
                yield read_and_apply(job, job.tasks[i])

    return apply


def read_and_apply(job: DirectJob, ranges: tuple[Range, ...]) -> pa.RecordBatch:
    clock = Clock()
    with clock.stage("input"):
        try:
            read = read_ranges(job.source, ranges, waits=job.waits, stamped=False)  # written: see why_not
            records = pa.Table.from_batches(list(read), ARROW_SCHEMA)
            rows = [staged(records, job.parse)] if records.num_rows else []
        except Exception as exc:  # declining is always safe: Spark's own rows follow
            which = ", ".join(f"{r.topic}-{r.partition}" for r in ranges)
            return result(NOTHING, clock, [], declined=f"{which}: {exc}")
    return apply_records(job.task, rows, clock)
