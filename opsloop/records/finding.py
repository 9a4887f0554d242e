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
"""

from __future__ import annotations

import enum
import hashlib
import math

from pydantic import Field, field_validator, model_validator

from opsloop.labels import label_string
from opsloop.records.base import JsonRecord
from opsloop.runbooks import finding_runbook_url
from opsloop.validation import LAST_TIME_S


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Finding(JsonRecord):
    RECORD = "finding"
    ENCODE_ID = True

    detector: str = Field(min_length=1)             # e.g. "firewall.unprotected_port"
    what: str = Field(min_length=1)                 # one line for a human: "VM port without security group"
    where: dict[str, str] = Field(default_factory=dict)  # labels: host, port, listener, ...
    observed: float | str | None = None
    expected: float | str | None = None
    score: float = Field(ge=0.0, le=1.0, default=1.0)
    severity: Severity = Severity.WARNING
    explanation: str = ""
    first_seen: float
    last_seen: float
    cleared: bool = False
    runbook: str = ""
    dashboard: str = ""

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
