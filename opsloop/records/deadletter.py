"""The dead-letter record (``telemetry.deadletter``): why a record was refused, where it came from, and
the offending input, bounded (a record too large for Kafka would be refused again).

Optional fields (absent from dead letters written before them; readers take absence as "unknown"):

* ``key_truncated`` / ``key_bytes``: the key was longer than :data:`DEADLETTER_KEY_BYTES` and only its
  first bytes are kept (``key_bytes``: its length): it cannot be sent again as it was;
* ``replayed_from``: the refused record was a replay (``opsloop deadletter replay``), and this is its
  :data:`REPLAYED_FROM_HEADER` header: the dead letter (topic/partition/offset) it was replayed from;
* ``value_is``: what ``value`` holds (:data:`ValueIs`): ``record`` (the refused record's bytes),
  ``sample`` (one sample of it: a bad sample of a batch, a sample a handler refused), ``samples`` (an
  excerpt of its rejected samples), ``summary`` (a handler's summary, no record).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import orjson

SCHEMA_VERSION = 1
DEADLETTER_VALUE_LIMIT = 64 * 1024
# a key is an id (a series, a host): longer is garbage, kept bounded so the dead letter stays far below 1 MB
DEADLETTER_KEY_BYTES = 1024
# header `opsloop deadletter replay` puts on every record it sends: the dead letter it came from
REPLAYED_FROM_HEADER = "opsloop-replayed-from"
REPLAYED_FROM_CHARS = 512   # the header comes with the record: bounded like any input
ValueIs = Literal["record", "sample", "samples", "summary"]


def deadletter_record(reason: str, *, topic: str, partition: int | None = None, offset: int | None = None,
                      key: bytes | None = None, value: Any = None, stage: str = "stream",
                      replayed_from: str | None = None, value_is: ValueIs | None = None) -> bytes:
    """The dead-letter record: why, where it came from, and the offending input (bounded)."""
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "reason": reason,
        "stage": stage,
        "source_topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key,
        "received_at": time.time(),
    }
    raw_key = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key
    if isinstance(raw_key, bytes):
        doc["key"] = raw_key[:DEADLETTER_KEY_BYTES].decode("utf-8", "backslashreplace")
        if len(raw_key) > DEADLETTER_KEY_BYTES:
            # a cut key names another partition and state key: the reader must know it is not the key
            doc["key_truncated"] = True
            doc["key_bytes"] = len(raw_key)
    if replayed_from is not None:
        doc["replayed_from"] = replayed_from[:REPLAYED_FROM_CHARS]
    if value_is is not None:
        doc["value_is"] = value_is
    if isinstance(value, bytes):
        try:
            doc["value"] = value[:DEADLETTER_VALUE_LIMIT].decode("utf-8")
        except UnicodeDecodeError:
            doc["value_b64"] = base64.b64encode(value[:DEADLETTER_VALUE_LIMIT]).decode()
        doc["truncated"] = len(value) > DEADLETTER_VALUE_LIMIT
    else:
        doc["value"] = value
    return orjson.dumps(doc, default=str)


def replayed_from_header(headers: Any) -> str | None:
    """The :data:`REPLAYED_FROM_HEADER` of a consumed record's headers (a list of (name, value) pairs, as
    Kafka clients give them, or a mapping), as text; None when absent. Never raises on odd headers."""
    if not headers:
        return None
    try:
        pairs = headers.items() if hasattr(headers, "items") else headers
        for pair in pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                continue
            name, value = pair
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            if name != REPLAYED_FROM_HEADER:
                continue
            if isinstance(value, (bytes, bytearray, memoryview)):
                text = bytes(value[:REPLAYED_FROM_CHARS * 4]).decode("utf-8", "backslashreplace")
            else:
                text = "" if value is None else str(value)
            return text[:REPLAYED_FROM_CHARS] or "?"   # present but empty: still a replay
    except TypeError:   # not iterable as pairs: no header we know
        return None
    return None


def deadletter_key(key: bytes | None) -> bytes | None:
    """The Kafka key of a dead letter: the refused record's, cut to ``DEADLETTER_KEY_BYTES`` as its body's ``key``
    (which says ``key_truncated``/``key_bytes``). Sent whole, a key near 1 MB took the message past Kafka's limit
    and the producer refused it: the dead letter was lost."""
    return key[:DEADLETTER_KEY_BYTES] if key is not None and len(key) > DEADLETTER_KEY_BYTES else key
