"""Where findings go: the ``findings`` topic (keyed by finding id) and Prometheus.

Kafka: one record per lifecycle event of a finding (opened, updated, refreshed, cleared; see
``FindingBook``), value ``Finding.encode()``, key the finding id (so a compacted topic keeps the
latest state of every finding), headers ``event`` and ``detector``.

Prometheus (the worker's /metrics):

* ``opsloop_finding_active{detector, severity, id, <where labels>}`` 1 while open, 0 once cleared
  (kept ``cleared_retention_s`` so that dashboards and alert rules see the resolve, then dropped);
* ``opsloop_finding_score{...}`` the finding's score in [0, 1];
* ``opsloop_findings_total{detector, severity, event}`` counter of published events.

The where labels differ per detector (hypervisor/port/vm, host/generation, ...), so the gauges are
exported by a custom collector whose samples carry each finding's own label set: an alert rule can
then say *which* VM port is open without parsing an id.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter
from prometheus_client.metrics_core import Metric as PromMetric

from opsloop.records import Finding
from opsloop.log import get_logger
from opsloop.streams.agents.base import Publication

log = get_logger("stream.findings")

FINDINGS_TOTAL = Counter("opsloop_findings_total", "Finding lifecycle events published to the findings topic",
                         ["detector", "severity", "event"])
SEND_ERRORS = Counter("opsloop_findings_send_errors_total", "Findings that could not be sent to Kafka", ["detector"])

_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
_RESERVED = frozenset({"detector", "severity", "id", "job", "instance", "__name__"})
MAX_LABEL_VALUE = 128


def finding_labels(f: Finding) -> dict[str, str]:
    """Prometheus labels of a finding: detector, severity, id and its where labels (sanitised)."""
    labels = {"detector": f.detector, "severity": f.severity.value, "id": f.id}
    for k, v in sorted(f.where.items()):
        name = _LABEL_NAME.sub("_", k)
        if not name or name[0].isdigit() or name.startswith("__"):
            name = "where_" + name.lstrip("_")
        if name in _RESERVED:
            name = "where_" + name
        labels.setdefault(name, str(v)[:MAX_LABEL_VALUE])
    return labels


@dataclass(slots=True)
class _Entry:
    labels: dict[str, str]
    active: bool
    score: float
    cleared_at: float | None = None   # wall clock, for the retention of the 0 sample


class ActiveFindings:
    """The custom collector behind ``opsloop_finding_active`` and ``opsloop_finding_score``."""

    def __init__(self, cleared_retention_s: float = 600.0) -> None:
        self.cleared_retention_s = cleared_retention_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()   # /metrics is served from another thread

    def update(self, finding: Finding) -> None:
        with self._lock:
            if finding.cleared:
                prev = self._entries.get(finding.id)
                labels = prev.labels if prev else finding_labels(finding)
                self._entries[finding.id] = _Entry(labels, False, 0.0, time.time())
            else:
                self._entries[finding.id] = _Entry(finding_labels(finding), True, finding.score)

    def only_open(self, finding_ids: set[str]) -> int:
        """Drop the entries shown open that are not in ``finding_ids`` (cleared ones stay their retention);
        how many went."""
        with self._lock:
            gone = [k for k, e in self._entries.items() if e.active and k not in finding_ids]
            for k in gone:
                del self._entries[k]
        return len(gone)

    def get(self, finding_id: str) -> _Entry | None:
        with self._lock:
            return self._entries.get(finding_id)

    def collect(self) -> Iterator[PromMetric]:
        now = time.time()
        active = PromMetric("opsloop_finding_active", "1 while a finding is open, 0 for a while after it cleared",
                            "gauge")
        score = PromMetric("opsloop_finding_score", "Score in [0, 1] of an open finding", "gauge")
        with self._lock:
            for fid in [k for k, e in self._entries.items()
                        if e.cleared_at is not None and now - e.cleared_at > self.cleared_retention_s]:
                del self._entries[fid]
            for e in self._entries.values():
                active.add_sample("opsloop_finding_active", e.labels, 1.0 if e.active else 0.0)
                score.add_sample("opsloop_finding_score", e.labels, e.score)
        yield active
        yield score

    def describe(self) -> list[PromMetric]:
        return []   # samples vary; avoid calling collect() at registration time


ACTIVE = ActiveFindings()
REGISTRY.register(ACTIVE)

Send = Callable[[bytes, bytes, list[tuple[str, bytes]]], Awaitable[object]]


class FindingsSink:
    """Publishes findings through ``send(key, value, headers)`` and keeps the gauges in step."""

    def __init__(self, send: Send | None, active: ActiveFindings = ACTIVE) -> None:
        self.send = send
        self.active = active

    async def publish(self, publications: Iterable[Publication]) -> int:
        """Send every publication in order; a failed send is counted and logged, never raised."""
        sent = 0
        for event, finding in publications:
            self.active.update(finding)
            FINDINGS_TOTAL.labels(finding.detector, finding.severity.value, event).inc()
            log.info("finding", kind=event, detector=finding.detector, id=finding.id,
                     severity=finding.severity.value, where=finding.where, observed=finding.observed)
            if self.send is None:
                continue
            headers = [("event", event.encode()), ("detector", finding.detector.encode())]
            try:
                await self.send(finding.id.encode(), finding.encode(), headers)
                sent += 1
            except Exception as e:  # noqa: BLE001 - a broker hiccup must not stop the detectors
                SEND_ERRORS.labels(finding.detector).inc()
                log.error("finding_send_failed", detector=finding.detector, id=finding.id,
                          error=f"{type(e).__name__}: {e}")
        return sent

    def restore(self, open_findings: Iterable[Finding]) -> None:
        """Show the findings recovered from detector state as active (nothing is re-published): these and
        no others, of every handler at once. One shown open but not recovered belongs to a partition that
        went to another worker, which shows it now (and clears it): left here, it stayed 1 for good."""
        restored = [f for f in open_findings if not f.cleared]
        gone = self.active.only_open({f.id for f in restored})
        if gone:
            log.info("findings_handed_over", findings=gone)
        for f in restored:
            self.active.update(f)
