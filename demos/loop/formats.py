"""The input's value format: JSON, or Avro under a schema registry (`make demo FORMAT=avro`).

Avro values are framed as Confluent's serializer frames them (outbox/core/wire.py),
under the schema registered for the input topic's value subject; the Spark job
reads them with parse_avro. The poison event, whose number is not one, has no
Avro form: it is sent as JSON, a value without the magic byte, which the sink
dead-letters as such.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from outbox.core.registry import Registry
from outbox.core.wire import frame, framed

FORMATS = ("json", "avro")
SCHEMA = {
    "type": "record",
    "name": "Number",
    "namespace": "demo",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "account", "type": "long"},
        {"name": "seq", "type": "long"},
        {"name": "n", "type": "long"},
    ],
}
Encode = Callable[[dict[str, Any]], bytes]


def json_value(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def avro_encoder(registry: str, topic: str) -> Encode:
    """Register the schema under `<topic>-value` and return what frames a document under it."""
    from confluent_kafka.schema_registry import Schema
    from fastavro import parse_schema, schemaless_writer

    schema = Schema(json.dumps(SCHEMA), "AVRO")
    schema_id = Registry.of(registry).ask(lambda c: c.register_schema(f"{topic}-value", schema))
    parsed = parse_schema(SCHEMA)

    def encode(doc: dict[str, Any]) -> bytes:
        if not isinstance(doc["n"], int):
            return json_value(doc)  # the poison event: no Avro form
        body = io.BytesIO()
        schemaless_writer(body, parsed, doc)
        return frame(schema_id, body.getvalue())

    return encode


def decode(value: bytes | None) -> dict[str, Any]:
    """An input value read back, in either format (the verdict's reader; one schema, known here)."""
    from fastavro import parse_schema, schemaless_reader

    got = framed(value or b"")
    if isinstance(got, str):
        return dict(json.loads(value or b"{}"))
    read = schemaless_reader(io.BytesIO(bytes(got[1])), parse_schema(SCHEMA), None)
    assert isinstance(read, dict)
    return read
