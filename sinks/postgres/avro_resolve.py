"""What Avro's resolution gives a reader, where fastavro alone gives something else.

The specification (and Avro's Java implementation) reads a resolved value as
the reader schema says: a field the writer lacks gets the reader's default,
read as a value of the field's type, its logical type included (a `bytes`
default is the code points of a JSON string, a decimal's are its two's
complement, a timestamp-millis default is milliseconds); and a logical type
is the reader's, not the writer's (a writer's `long` read by a reader's
`timestamp-millis` is an instant). fastavro fills in a default as its raw
JSON and applies the writer's logical type. Both are corrected here once per
schema, not per record: the reader's defaults are made the values they
stand for, and the writer schema is given the reader's logical types
wherever the two meet, so fastavro's own readers convert them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

AvroSchema = Any  # fastavro's parsed schema: a name, a dict, or a list (a union)
Converter = Callable[[Any, AvroSchema, AvroSchema], Any]

_PRIMITIVE = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_LOGICAL_KEYS = ("logicalType", "precision", "scale")
# A reader's logical type on a `long` met by a writer's `int`: Avro promotes the int, then reads it
# as the reader's type. fastavro keys converters by the writer's type, so the aligned writer names
# these under a logical type of this module's own, which no schema of a user's carries.
_PROMOTED_PREFIX = "outbox-eos.promoted."
_PROMOTABLE = (
    "timestamp-millis",
    "timestamp-micros",
    "local-timestamp-millis",
    "local-timestamp-micros",
    "time-micros",
)


@functools.cache
def _standard() -> dict[str, Converter]:
    """fastavro's converters by "<type>-<logical type>": the pairs the specification defines. A
    logical type on another type is ignored, by the specification and here (and by spark_type)."""
    from fastavro import read  # the registry extra's, imported where Avro is read

    return dict(read.LOGICAL_READERS)


@functools.cache
def _promoted() -> dict[str, Converter]:
    """The converters of the promoted logical types, registered with fastavro's own readers."""
    from fastavro import read

    promoted = {f"int-{_PROMOTED_PREFIX}{logical}": _standard()[f"long-{logical}"] for logical in _PROMOTABLE}
    read.LOGICAL_READERS.update(promoted)
    return promoted


def _matches(writer: AvroSchema, reader: AvroSchema, named: dict[str, Any]) -> bool:
    """fastavro's own test of which reader branch of a union a writer node is read into."""
    from fastavro import _read_py

    match: Callable[[AvroSchema, AvroSchema, dict[str, Any]], bool] = _read_py.match_types
    return match(writer, reader, named)


def with_defaults(reader: AvroSchema) -> AvroSchema:
    """A copy of the parsed reader schema whose field defaults are the values they stand for."""
    out = copy.deepcopy(reader)
    named = out.get("__named_schemas", {}) if isinstance(out, dict) else {}
    fields = {id(f): f for record in _records(out, named) for f in record["fields"]}  # shared by copies
    for field in fields.values():
        if "default" in field:
            field["default"] = default_value(field["type"], field["default"], named)
    return out


def _records(schema: AvroSchema, named: dict[str, Any]) -> list[dict[str, Any]]:
    """The record definitions in a parsed schema, each once."""
    found: dict[int, dict[str, Any]] = {}

    def walk(node: AvroSchema) -> None:
        if isinstance(node, list):
            for branch in node:
                walk(branch)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error") and id(node) not in found:
                found[id(node)] = node
                for field in node["fields"]:
                    walk(field["type"])
            elif kind == "array":
                walk(node["items"])
            elif kind == "map":
                walk(node["values"])

    walk(schema)
    for definition in named.values():
        walk(definition)
    return list(found.values())


def default_value(schema: AvroSchema, value: Any, named: dict[str, Any]) -> Any:
    """A field default (JSON) as the value of its type that a decoded record would hold."""
    if value is None:
        return None
    if isinstance(schema, list):  # the default is of the union's first type (or, null aside, next)
        branches = [b for b in schema if b != "null"] if schema and schema[0] == "null" else schema
        return default_value(branches[0], value, named) if branches else value
    if isinstance(schema, str):
        return _plain(schema, value) if schema in _PRIMITIVE else default_value(named[schema], value, named)
    kind = schema["type"]
    if kind in ("record", "error"):
        return {
            f["name"]: default_value(f["type"], value.get(f["name"], f.get("default")), named)
            for f in schema["fields"]
        }
    if kind == "array":
        return [default_value(schema["items"], v, named) for v in value]
    if kind == "map":
        return {k: default_value(schema["values"], v, named) for k, v in value.items()}
    if kind == "enum":
        return value
    data = _plain(kind, value)
    convert = _standard().get(f"{kind}-{schema.get('logicalType')}")
    return data if convert is None else convert(data, schema, schema)


def _plain(kind: str, value: Any) -> Any:
    if kind in ("bytes", "fixed") and isinstance(value, str):
        return value.encode("latin-1")  # the specification's rule: code points 0-255 are the bytes
    if kind in ("float", "double") and isinstance(value, int):
        return float(value)
    return value


def aligned(writer: AvroSchema, reader: AvroSchema) -> AvroSchema:
    """A copy of the parsed writer schema carrying the reader's logical types where they meet (and
    none that the specification ignores: give the writer itself as the reader for that alone)."""
    _promoted()  # registered before fastavro reads with the aligned schema
    out = copy.deepcopy(writer)
    named = {
        "writer": out.get("__named_schemas", {}) if isinstance(out, dict) else {},
        "reader": reader.get("__named_schemas", {}) if isinstance(reader, dict) else {},
    }
    return _align(out, reader, named, set())


def _align(w: AvroSchema, r: AvroSchema, named: dict[str, Any], done: set[int]) -> AvroSchema:
    """The writer's node with the reader's logical types, as fastavro pairs the two nodes."""
    if isinstance(r, str) and r not in _PRIMITIVE:
        r = named["reader"].get(r, r)
    if isinstance(w, list):
        return [_align(b, r, named, done) for b in w]
    if isinstance(r, list):
        branch = next((b for b in r if _matches(w, b, named)), None)  # as fastavro picks it
        return w if branch is None else _align(w, branch, named, done)
    if isinstance(w, str) and w not in _PRIMITIVE:
        return w  # a named type met again: aligned where it is defined
    kind = w if isinstance(w, str) else w["type"]
    r_kind = r if isinstance(r, str) else r.get("type")
    if isinstance(w, dict) and id(w) in done:
        return w
    if kind in ("record", "error") and isinstance(r, dict) and r_kind in ("record", "error"):
        done.add(id(w))
        by_name = {f["name"]: f for f in r["fields"]}
        by_name.update({a: f for f in r["fields"] for a in f.get("aliases", []) if a not in by_name})
        for field in w["fields"]:
            if field["name"] in by_name:
                field["type"] = _align(field["type"], by_name[field["name"]]["type"], named, done)
        return w
    if kind == "array" and r_kind == "array":
        w["items"] = _align(w["items"], r["items"], named, done)
        return w
    if kind == "map" and r_kind == "map":
        w["values"] = _align(w["values"], r["values"], named, done)
        return w
    if kind in _PRIMITIVE or kind == "fixed":
        return _annotated(w, kind, r)
    return w


def _annotated(w: AvroSchema, kind: str, r: AvroSchema) -> AvroSchema:
    """A primitive or fixed writer node with the reader's logical annotation in place of its own."""
    wants = {k: r[k] for k in _LOGICAL_KEYS if isinstance(r, dict) and k in r}
    logical = wants.get("logicalType")
    if f"{r if isinstance(r, str) else r['type']}-{logical}" not in _standard():
        wants = {}  # none, or one the specification ignores on the reader's type
    elif f"{kind}-{logical}" not in _standard():  # the writer's type is promoted to the reader's
        promoted = f"{_PROMOTED_PREFIX}{logical}"
        wants = {"logicalType": promoted} if f"{kind}-{promoted}" in _promoted() else {}
    if isinstance(w, str):
        return {"type": w, **wants} if wants else w
    for k in _LOGICAL_KEYS:
        w.pop(k, None)
    w.update(wants)
    return w


def lacking(writer: AvroSchema, reader: AvroSchema) -> list[str]:
    """The reader's fields that have no default and that the writer lacks (by name or alias), as
    dotted paths: no record of that writer schema resolves to the reader, whatever its values."""
    named = {
        "writer": writer.get("__named_schemas", {}) if isinstance(writer, dict) else {},
        "reader": reader.get("__named_schemas", {}) if isinstance(reader, dict) else {},
    }
    found: list[str] = []
    _lacking(writer, reader, named, "", found, set())
    return found


def _record(node: AvroSchema, named: dict[str, Any]) -> dict[str, Any] | None:
    """The record a field's type is: itself, a name of one, or a union of null and one."""
    if isinstance(node, list):
        records = [r for b in node if b != "null" and (r := _record(b, named)) is not None]
        return records[0] if len(records) == 1 and len(node) <= 2 else None
    if isinstance(node, str):
        return _record(named[node], named) if node in named else None
    return node if isinstance(node, dict) and node.get("type") in ("record", "error") else None


def _lacking(
    w: AvroSchema, r: AvroSchema, named: dict[str, Any], path: str, found: list[str], seen: set[int]
) -> None:
    writer, reader = _record(w, named["writer"]), _record(r, named["reader"])
    if writer is None or reader is None or id(writer) in seen:
        return
    seen.add(id(writer))
    fields = {f["name"]: f for f in writer["fields"]}
    for field in reader["fields"]:
        source = next((fields[n] for n in (field["name"], *field.get("aliases", [])) if n in fields), None)
        if source is None and "default" not in field:
            found.append(f"{path}{field['name']}")
        elif source is not None:
            _lacking(source["type"], field["type"], named, f"{path}{field['name']}.", found, seen)
