"""Serializers: how a message's key and value become the bytes of a record.

A serializer is any object with ``serialize(value) -> bytes | None`` (``None``
stays ``None``: a null key or a tombstone). Three ship with txbridge: raw bytes,
text, and Avro (schemaless, fastavro).
"""

from __future__ import annotations

import io
from typing import Any, Protocol, runtime_checkable

import fastavro

from txbridge.errors import SerializationError


@runtime_checkable
class Serializer(Protocol):
    """Turns a key or value into bytes; ``None`` passes through as ``None``."""

    def serialize(self, value: Any) -> bytes | None: ...


class BytesSerializer:
    """Raw bytes (``bytes``, ``bytearray`` or ``memoryview``) as they are."""

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        raise SerializationError(
            f"BytesSerializer takes bytes, got {type(value).__name__}: "
            "pass value_serializer=StringSerializer() or AvroSerializer(schema)"
        )

    def deserialize(self, data: bytes | None) -> bytes | None:
        return data

    def __repr__(self) -> str:
        return "BytesSerializer()"


class StringSerializer:
    """Text, encoded with ``encoding`` (UTF-8 by default)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self.encoding = encoding

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        if not isinstance(value, str):
            raise SerializationError(f"StringSerializer takes str, got {type(value).__name__}")
        return value.encode(self.encoding)

    def deserialize(self, data: bytes | None) -> str | None:
        return None if data is None else data.decode(self.encoding)

    def __repr__(self) -> str:
        return f"StringSerializer({self.encoding!r})"


class AvroSerializer:
    """Avro binary without a container header (fastavro's schemaless writer).

    Args:
        schema: the Avro schema as a dict (parsed once, here: no I/O).

    Raises:
        SerializationError: the schema is not a valid Avro schema.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        try:
            self._schema = fastavro.parse_schema(schema)
        except Exception as exc:  # fastavro raises several unrelated types for a bad schema
            raise SerializationError(f"invalid Avro schema: {exc}") from exc
        self.schema = schema

    def serialize(self, value: Any) -> bytes | None:
        if value is None:
            return None
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self._schema, value)
        except Exception as exc:  # ValueError, TypeError, AttributeError... depending on the field
            raise SerializationError(
                f"value does not match Avro schema {self.schema.get('name', '?')}: {exc}"
            ) from exc
        return buffer.getvalue()

    def deserialize(self, data: bytes | None) -> Any:
        """Read back what :meth:`serialize` wrote (same schema)."""
        if data is None:
            return None
        try:
            return fastavro.schemaless_reader(io.BytesIO(data), self._schema, None)
        except Exception as exc:  # truncated or foreign bytes surface as EOFError, IndexError...
            raise SerializationError(f"bytes are not Avro of schema {self.schema.get('name', '?')}") from exc

    def __repr__(self) -> str:
        return f"AvroSerializer({self.schema.get('name', '?')!r})"
