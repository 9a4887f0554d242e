"""One audit record: who did what to which target, from which state to which, why, and how it went.

Every actuator (edge-weight pushes, rollbacks, pages) writes one record per action, whatever the
mode: a dry run and a shadow decision are audited like a live one, so "what would it have done"
is answerable too. The record is the same on the Kafka ``audit`` topic and in Elasticsearch.

    rec = AuditRecord(actor="controller.edge", action="edge.weights.push", target="haproxy:ams1/app",
                      edge="ams1", listener="app", version=42, before={"eu": 0.9, "us-east": 0.1},
                      after={"eu": 0.6, "us-east": 0.4}, reason="origin eu over capacity (1.12)",
                      mode="live", result="applied")

``id`` is derived from the content (actor, action, target, version, mode, time), so re-sending a
record after a retry is idempotent: Elasticsearch answers 409 for the copy and the trail holds one.
Keys that look secret are masked in ``before``, ``after`` and ``labels`` (no secrets in the trail).
"""

from __future__ import annotations

import enum
import hashlib
import math
import time
from datetime import datetime, timezone
from typing import Annotated, Any

import orjson
from pydantic import ConfigDict, Field, field_validator

from opsloop.log import redact
from opsloop.records.base import JsonRecord, Number, RecordError, no_bool

TOKEN = r"^[a-z][a-z0-9_.:\-]*$"   # actor, action, result: lowercase dotted tokens
MAX_STATE_BYTES = 32 * 1024         # before/after: a weights row or a page, not a dump


class AuditError(RecordError):
    """An audit record that cannot be built; the message names the field and value."""


class AuditMode(str, enum.Enum):
    """How the action was carried out."""

    DRY_RUN = "dry-run"   # computed and printed, nothing sent anywhere
    SHADOW = "shadow"     # computed next to the live controller and compared, not applied
    LIVE = "live"         # applied to the target


# Conventional results (free lowercase tokens are accepted, these are what the dashboards expect).
RESULTS = ("applied", "unchanged", "skipped", "held", "failed", "rolled-back", "sent", "resolved")


class AuditRecord(JsonRecord):
    model_config = ConfigDict(frozen=True)
    RECORD = "audit record"
    ENCODE_ID = True
    ERROR = AuditError

    time: Number = Field(default_factory=time.time, ge=946684800, le=4102444800)  # epoch seconds (event time)
    actor: str = Field(min_length=1, max_length=100, pattern=TOKEN)
    action: str = Field(min_length=1, max_length=100, pattern=TOKEN)
    target: str = Field(min_length=1, max_length=300)
    edge: str | None = Field(default=None, min_length=1, max_length=200)
    listener: str | None = Field(default=None, min_length=1, max_length=200)
    # a bool was version 1 (lax int); an integral float is still an int (12.0: 12), digits a string as before
    version: Annotated[int | str | None, no_bool("an integer, a string or null")] = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    reason: str = Field(default="", max_length=4000)
    mode: AuditMode
    result: str = Field(min_length=1, max_length=40, pattern=TOKEN)
    error: str | None = Field(default=None, max_length=4000)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)

    @field_validator("before", "after")
    @classmethod
    def _state(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        try:
            size = len(orjson.dumps(v))
        except TypeError as e:
            raise ValueError(f"not JSON-serialisable ({e})") from None
        if size > MAX_STATE_BYTES:
            raise ValueError(f"{size} bytes of state; at most {MAX_STATE_BYTES}")
        return redact(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return redact(v)

    @property
    def id(self) -> str:
        key = f"{self.actor}|{self.action}|{self.target}|{self.version}|{self.mode.value}|{self.time:.6f}"
        return hashlib.sha1(key.encode()).hexdigest()[:20]

    @property
    def timestamp(self) -> str:
        """ISO 8601 UTC with milliseconds (Elasticsearch's ``@timestamp``)."""
        return datetime.fromtimestamp(self.time, timezone.utc).isoformat(timespec="milliseconds").replace(
            "+00:00", "Z")

    def changes(self) -> dict[str, tuple[Any, Any]]:
        """Keys whose value differs between ``before`` and ``after`` (a weights row: the origins that moved)."""
        before, after = self.before or {}, self.after or {}
        out: dict[str, tuple[Any, Any]] = {}
        for k in sorted(set(before) | set(after)):
            a, b = before.get(k), after.get(k)
            if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, abs_tol=1e-9):
                continue
            if a != b:
                out[k] = (a, b)
        return out

    def document(self) -> dict[str, Any]:
        """The Elasticsearch document (see templates/audit.json for the mapping)."""
        doc = self.model_dump(mode="json", exclude={"time"})
        doc["@timestamp"] = self.timestamp
        doc["id"] = self.id
        # version stays as given in _source (int or str); the keyword mapping indexes it as text.
        doc["changed"] = list(self.changes())
        return doc

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> "AuditRecord":
        """Rebuild a record from an Elasticsearch ``_source``."""
        d = {k: v for k, v in doc.items() if k not in ("@timestamp", "id", "changed")}
        ts = doc.get("@timestamp")
        if not isinstance(ts, str):
            raise AuditError(f"audit document: @timestamp missing or not a string (got {ts!r})")
        d["time"] = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
        return cls.build(**d)
