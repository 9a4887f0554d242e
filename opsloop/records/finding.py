"""Findings: what the stream detectors conclude, as published on the ``findings`` topic.

A finding is keyed by ``id`` (detector + where): re-publishing the same id updates it (last_seen,
observed, score); ``cleared=True`` closes it. The paging actuator turns open critical/warning
findings into Alertmanager alerts and their clearing into resolves.

Every finding carries an absolute ``runbook`` link: a detector may name its own page with an
absolute URL; anything else (empty, or a path relative to nothing in particular) becomes the
section of its finding type in ``docs/runbooks/`` under the configured runbook base URL
(``opsloop.runbooks``), the same link its alert rule carries.
"""

from __future__ import annotations

import enum
import hashlib

from pydantic import Field, model_validator

from opsloop.labels import label_string
from opsloop.records.base import JsonRecord
from opsloop.runbooks import finding_runbook_url


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

    @model_validator(mode="after")
    def _runbook_link(self) -> "Finding":
        if not self.runbook.startswith(("http://", "https://")):
            self.runbook = finding_runbook_url(self.detector)
        return self

    @property
    def id(self) -> str:
        # label_string escapes , = | \ in keys and values: unambiguous, and unchanged for plain values.
        return hashlib.sha1(f"{self.detector}|{label_string(self.where)}".encode()).hexdigest()[:16]
