"""Findings: what the stream detectors conclude, as published on the ``findings`` topic.

A finding is keyed by ``id`` (detector + where): re-publishing the same id updates it (last_seen,
observed, score); ``cleared=True`` closes it. The paging actuator turns open critical/warning
findings into Alertmanager alerts and their clearing into resolves.

Every finding carries an absolute ``runbook`` link: a detector may name its own page with an
absolute URL; anything else (empty, or a path relative to nothing in particular) becomes the
section of its finding type in ``docs/runbooks/`` under the configured runbook base URL
(``opsloop.runbooks``), the same link its alert rule carries.

``first_seen`` and ``last_seen`` are times a consumer can write down: seconds from 1970 to the end of 9999
(:data:`opsloop.validation.LAST_TIME_S`, the last second an RFC 3339 stamp holds). A record beyond is refused
where it is built or decoded, naming the field, and the paging actuator dead-letters it (before, one from
before 1970 was paged as starting then). Detectors stamp findings with sample times (2000..2100,
:mod:`opsloop.records.metric`): always inside. ``first_seen`` may be after ``last_seen``: the weight
actuators date their fail-static finding by the wall clock, which can step back.

Numbers are numbers (``first_seen``, ``last_seen``, ``score``; ``observed``/``expected`` a number, a string or
null) and ``cleared`` is a JSON bool: ``"first_seen": true`` was read as 1970, ``"cleared": 1`` as cleared.
``where`` is bounded (:data:`MAX_WHERE` labels, keys up to :data:`MAX_WHERE_KEY` characters, values up to
:data:`MAX_WHERE_VALUE`): a poison record with 80,000 labels decoded, and every consumer (its id, paging's
labels, the audit trail) paid for them. Refused at decode, naming the field, like a time out of range.
"""

from __future__ import annotations

import enum
import hashlib
import math
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from opsloop.labels import label_string
from opsloop.records.base import Flag, JsonRecord, Number, no_bool
from opsloop.records.metric import MAX_TAGS
from opsloop.runbooks import finding_runbook_url
from opsloop.validation import LAST_TIME_S, shown


# The most a detector puts in ``where``: the anomaly detector a sample's whole tag set (at most MAX_TAGS) plus
# ``metric`` and ``field``; the others a few keys (host, port, vm; listener, edge). The stream stage cuts tag
# keys and values to 256 characters before they reach a finding (opsloop.streams.runtime.gauges, a label's
# bound); the controllers' names are at most 200. Paging keeps 20 labels, names of 100, values of 256, and
# shortens the rest with a hash: these bounds sit above everything a producer writes and what paging shows.
MAX_WHERE = MAX_TAGS + 2
MAX_WHERE_KEY = 256
MAX_WHERE_VALUE = 1024
# a value of ``where`` as a type, for settings whose names end up there (the record checks its own in _where_bounds)
WhereValue = Annotated[str, Field(max_length=MAX_WHERE_VALUE)]
# a reading: a number (an int is taken), a string (a version, a reason) or null; a bool is none of them
Reading = Annotated[Number | str | None, no_bool("a number, a string or null")]


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Finding(JsonRecord):
    RECORD = "finding"
    ENCODE_ID = True

    detector: str = Field(min_length=1)             # e.g. "firewall.unprotected_port"
    what: str = Field(min_length=1)                 # one line for a human: "VM port without security group"
    where: dict[str, str] = Field(default_factory=dict)  # labels: host, port, listener (bounds: _where_bounds)
    observed: Reading = None
    expected: Reading = None
    score: Number = Field(ge=0.0, le=1.0, default=1.0)
    severity: Severity = Severity.WARNING
    explanation: str = ""
    first_seen: Number
    last_seen: Number
    cleared: Flag = False
    runbook: str = ""
    dashboard: str = ""

    @field_validator("where", mode="before")
    @classmethod
    def _where_bounds(cls, value: Any) -> Any:
        # before pydantic's own checks: the count first (80,000 labels cost nothing more), and one short message
        # naming the label (pydantic's put each long key whole into an error's path, one error per label)
        if not isinstance(value, dict):
            return value   # pydantic names the type
        if len(value) > MAX_WHERE:
            raise ValueError(f"{len(value)} labels, at most {MAX_WHERE}")
        for key, label in value.items():
            if isinstance(key, str) and len(key) > MAX_WHERE_KEY:
                raise ValueError(f"label name {shown(key)}: {len(key)} characters, at most {MAX_WHERE_KEY}")
            if not isinstance(label, str):
                raise ValueError(f"label {shown(key)}: expected a string, got {shown(label)}")
            if len(label) > MAX_WHERE_VALUE:
                raise ValueError(f"label {shown(key)}: value of {len(label)} characters, at most {MAX_WHERE_VALUE}")
        return value

    @field_validator("first_seen", "last_seen")
    @classmethod
    def _a_time(cls, value: float) -> float:
        if 0.0 <= value <= LAST_TIME_S:   # NaN fails both comparisons
            return value
        if not math.isfinite(value):
            why = "not a finite number"
        elif value < 0:
            why = "before 1970"
        else:   # the common mistake: a time in milliseconds (up to 9999 in ms), else nothing we can guess
            why = "after the year 9999" + (" (milliseconds?)" if value <= LAST_TIME_S * 1000 else "")
        raise ValueError(f"{why}: expected seconds since the epoch, from 1970 to the end of 9999")

    @model_validator(mode="after")
    def _runbook_link(self) -> "Finding":
        if not self.runbook.startswith(("http://", "https://")):
            self.runbook = finding_runbook_url(self.detector)
        return self

    @property
    def id(self) -> str:
        # label_string escapes , = | \ in keys and values: unambiguous, and unchanged for plain values.
        return hashlib.sha1(f"{self.detector}|{label_string(self.where)}".encode()).hexdigest()[:16]
