"""Firewall agent: ``telemetry.iptables`` -> unprotected VM ports (critical) and drift between hypervisors.

Feeds ``opsloop.streams.detectors.firewall.detector.FirewallDetector`` one report per hypervisor and round (see
``report_from_metrics`` for the collector's metric names). State key: the hypervisor (its last
report and the findings about it). Gauges, per hypervisor, for the firewall dashboard:

* ``opsloop_firewall_ports{hypervisor, role, state="protected"|"unprotected"}``: VM ports by state;
* ``opsloop_firewall_drift{hypervisor, role, kind="ruleset"|"package"}``: 1 while drifting;
* ``opsloop_firewall_report_timestamp_seconds{hypervisor}``: event time of the last round.

A round is read as one whole (only a round with its host-level sample clears the findings of ports
missing from it), so the handler names it to the runtime (``isolation_key``: hypervisor and time): after
a failure the samples are handed back a round at a time, and a poison sample costs its round only. A
round whose records two batches share comes as two parts: the detector adds the later part to the
hypervisor's report of that round (kept in its state, so across a restart too); a part handed again
after a failure is added alike and changes nothing.

Drift compares the hypervisors whose partitions this worker holds: all of them with one worker
(the deployment here). With several workers, drift would need the reports re-keyed by role
(a repartition topic); unprotected ports, the page that matters, are per hypervisor and exact.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Mapping, Sequence

from prometheus_client import Gauge

from opsloop.records import Metric
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler, drop_children
from opsloop.streams.detectors.firewall.settings import FirewallSettings
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.firewall.detector import (FINGERPRINT_DRIFT, FIREWALL_METRICS, PACKAGE_DRIFT,
                                                         FirewallDetector, HypervisorReport, report_from_metrics)
from opsloop.streams.runtime.gauges import child

PORTS = Gauge("opsloop_firewall_ports", "VM ports per hypervisor by firewall state", ["hypervisor", "role", "state"])
DRIFT = Gauge("opsloop_firewall_drift", "1 while the hypervisor's ruleset or packages differ from its role",
              ["hypervisor", "role", "kind"])
REPORT_TS = Gauge("opsloop_firewall_report_timestamp_seconds", "Event time of the hypervisor's last firewall round",
                  ["hypervisor"])


class FirewallHandler(DetectorHandler):
    name = "firewall-detector"
    topics = (Topic.IPTABLES,)
    key_label = "hypervisor"
    names = FIREWALL_METRICS   # what report_from_metrics reads

    def __init__(self, settings: FirewallSettings | None = None, refresh_s: float = 300.0) -> None:
        super().__init__()
        self.settings = settings or FirewallSettings()
        self.refresh_s = refresh_s
        self.detector = self._new_detector()
        self._roles_shown: dict[str, str] = {}

    def _new_detector(self) -> FirewallDetector:
        return FirewallDetector(self.settings.min_role_size, book=FindingBook(self.refresh_s))

    @staticmethod
    def isolation_key(m: Metric) -> Hashable:
        """The round a sample belongs to, as ``report_from_metrics`` groups them: after a failure the
        runtime hands a round back whole (handed a sample at a time, a ruleset sample read as a complete
        round without ports: every unprotected-port finding of its hypervisor cleared, and the last
        sample alone became the hypervisor's report, drift findings cleared with its fingerprint). Of a
        round split across batches, the unit is this batch's part, added to the earlier part as ever."""
        return m.tags.get("hypervisor") or m.tags.get("host"), m.timestamp

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        roles: dict[str, float] = {}   # role -> event time of its newest report in this batch
        for report in report_from_metrics(metrics, self.settings.roles):
            prev = self.detector.latest.get(report.hypervisor)
            if prev is not None and report.timestamp < prev.timestamp:
                continue   # an older round replayed after a newer one: it says nothing new
            self.detector.update(report, drift=False)
            self.touch(report.hypervisor)
            self._show(self.detector.latest[report.hypervisor])   # the round so far: a part is added to it
            roles[report.role] = max(roles.get(report.role, report.timestamp), report.timestamp)
        # Each role compared once per batch, after all its reports (as the power handler does per
        # generation): per report it would walk every member of the role for each of them.
        for role, ts in roles.items():
            self.detector.drift(role, ts)
        if roles:   # drift changes only with a report (forget and restore refresh the gauges themselves)
            self._show_drift()

    def forget(self, keys: set[str]) -> None:
        for key in keys:
            self.detector.latest.pop(key, None)
            self._roles_shown.pop(key, None)
        for gauge in (PORTS, DRIFT, REPORT_TS):
            drop_children(gauge, "hypervisor", keys)

    def books(self) -> Iterable[FindingBook]:
        return (self.detector.book,)

    def state_of(self, key: str) -> dict[str, Any] | None:
        return self.detector.state_of(key)

    def reset(self) -> None:
        self.detector = self._new_detector()

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        self.detector.restore_part(key, state)
        rep = self.detector.latest.get(key)
        if rep is not None and self.trusted_time(rep.timestamp, f"report of {key}") is None:
            del self.detector.latest[key]   # else every later round would look older than it

    def after_restore(self) -> None:
        for rep in self.detector.latest.values():
            self._show(rep)
        self._show_drift()

    # ------------------------------------------------------------------------------- gauges
    def _show(self, rep: HypervisorReport) -> None:
        old_role = self._roles_shown.get(rep.hypervisor)
        if old_role is not None and old_role != rep.role:
            for state in ("protected", "unprotected"):
                _remove(PORTS, rep.hypervisor, old_role, state)
        self._roles_shown[rep.hypervisor] = rep.role
        child(PORTS, rep.hypervisor, rep.role, "unprotected").set(rep.unprotected)
        child(PORTS, rep.hypervisor, rep.role, "protected").set(len(rep.ports) - rep.unprotected)
        child(REPORT_TS, rep.hypervisor).set(rep.timestamp)

    def _show_drift(self) -> None:
        # the book's stored findings as they are (no Finding model per open finding and call)
        drifting = {(d["where"]["hypervisor"], d["where"].get("role", ""), "ruleset" if d["detector"] == FINGERPRINT_DRIFT
                     else "package") for d in self.detector.book.open.values()
                    if d["detector"] in (FINGERPRINT_DRIFT, PACKAGE_DRIFT)}
        for rep in self.detector.latest.values():
            for kind in ("ruleset", "package"):
                child(DRIFT, rep.hypervisor, rep.role, kind).set(1.0 if (rep.hypervisor, rep.role, kind) in drifting
                                                                else 0.0)


def _remove(gauge: Gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
