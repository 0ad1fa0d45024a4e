"""Confluent's wire format: a zero byte, the writer schema's id (4 bytes, big-endian), the body.

What schema registry serializers write and read, whatever the body's format
(Avro; for Protobuf the body starts with its message indexes).
"""

from __future__ import annotations

import struct

MAGIC = 0
HEADER = 5  # the magic byte and the schema id
_ID = struct.Struct(">I")


def frame(schema_id: int, body: bytes) -> bytes:
    """The body framed under its writer schema's id."""
    return bytes([MAGIC]) + _ID.pack(schema_id) + body


def framed(value: bytes) -> tuple[int, memoryview] | str:
    """The writer schema's id and the body of a framed value, or why the value is not framed."""
    if len(value) < HEADER or value[0] != MAGIC:
        return (
            "the value does not start with Confluent's magic byte 0 and a schema id:"
            " it was not written by a schema registry serializer"
        )
    (schema_id,) = _ID.unpack_from(value, 1)
    return schema_id, memoryview(value)[HEADER:]
