"""The dead-letter record (``telemetry.deadletter``): why a record was refused, where it came from, and
the offending input, bounded (a record too large for Kafka would be refused again)."""

from __future__ import annotations

import base64
import time
from typing import Any

import orjson

SCHEMA_VERSION = 1
DEADLETTER_VALUE_LIMIT = 64 * 1024


def deadletter_record(reason: str, *, topic: str, partition: int | None = None, offset: int | None = None,
                      key: bytes | None = None, value: Any = None, stage: str = "stream") -> bytes:
    """The dead-letter record: why, where it came from, and the offending input (bounded)."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "reason": reason,
        "stage": stage,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key,
        "received_at": time.time(),
    }
    if isinstance(value, bytes):
        try:
            doc["value"] = value[:DEADLETTER_VALUE_LIMIT].decode("utf-8")
        except UnicodeDecodeError:
            doc["value_b64"] = base64.b64encode(value[:DEADLETTER_VALUE_LIMIT]).decode()
        doc["truncated"] = len(value) > DEADLETTER_VALUE_LIMIT
    else:
        doc["value"] = value
    return orjson.dumps(doc, default=str)
