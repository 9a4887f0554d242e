"""Firewall detector: VM ports without their security-group chain, and drift between hypervisors.

"Temporary elevated reachability" (docs/sources.md): after a routine change, 5 hypervisors silently lost
the security-group rules of their VMs, and nobody noticed for a week. Rules here:

* a VM port whose security-group chain is absent -> **critical** finding at once (no warm-up),
  cleared as soon as a report shows the chain again or the port is gone;
* within one role, a hypervisor whose ruleset fingerprint differs from the role's majority, or
  whose version of a package differs from the majority -> **warning** (config / version drift).

Input: one report per hypervisor and round (``HypervisorReport``). The expected dict shape::

    {"hypervisor": "hv-zh-07", "role": "compute", "timestamp": 1795310400.0,
     "ports": [{"port": "tap3f2a", "vm": "b1c...", "chain_present": true}, ...],
     "ruleset_fingerprint": "sha256 of the normalised ruleset (VM-specific chains left out)",
     "packages": {"neutron-openvswitch-agent": "2:9.4.1-0ubuntu1", "iptables": "1.6.0"}}

``report_from_metrics`` builds reports from wire samples, grouped per hypervisor and round (event
timestamp), oldest first. It reads what ``collectors/iptables`` publishes:

* ``iptables_vm_port{host, port_id, vm, device}`` field ``protected`` (0/1) and ``reason``;
* ``iptables_ruleset{host}`` field ``base_fingerprint`` (the ruleset without per-port chains: equal on
  identically configured hypervisors whatever VMs they run; ``fingerprint`` if absent);
* ``iptables_software{host, package}`` field ``version``;

and the older generic shape ``firewall_port{hypervisor,port,vm}`` field ``chain_present``,
``firewall_host{hypervisor,role}`` fields ``ruleset_fingerprint`` and ``pkg_<name>``. The role comes
from a ``role`` tag (Telegraf ``[inputs.iptables.tags]``) or the ``roles`` map given to the adapter,
else ``default``. Only a *complete* round (one that carries the host-level sample) clears the
findings of ports missing from it: a partial report must not read as "port gone". A round may come in
parts (its records cut across two batches, in order: ports first, then the ruleset and the packages):
a later part of the hypervisor's last round is added to it (``HypervisorReport.merged``), and a newer
round keeps the previous round's fingerprint and package versions until it brings its own (``carrying``).

For the stream agent the detector's state splits per hypervisor (``state_of``/``restore_part``):
its last report and the findings about it, so each part lives with that hypervisor's partition.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from opsloop.records import Finding, Severity
from opsloop.records import Metric

from opsloop.streams.detectors.findingbook import FindingBook, where_key as _key
from opsloop.streams.detectors.state_check import (StateError, event_time, flag, get, items, obj, text,
                                                  texts)
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, label_value

UNPROTECTED = "firewall.unprotected_port"
FINGERPRINT_DRIFT = "firewall.ruleset_drift"
PACKAGE_DRIFT = "firewall.package_drift"
RUNBOOK = "runbooks/firewall.md"
HANDLER = "firewall-detector"   # the handler's name, for the count of label values shortened


@dataclass(slots=True)
class HypervisorReport:
    hypervisor: str
    role: str
    timestamp: float
    ports: dict[str, tuple[str, bool]] = field(default_factory=dict)   # port -> (vm, chain_present)
    ruleset_fingerprint: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)              # port -> why it is unprotected
    complete: bool = True        # carries the host-level sample: ports missing from it are gone
    # packages whose version is the previous round's, not re-reported by this round yet (``carrying``)
    carried: set[str] = field(default_factory=set)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "HypervisorReport":
        try:
            hv = str(doc["hypervisor"])
            ts = float(doc["timestamp"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"firewall report: missing or bad field {e} in {dict(doc)!r:.200}") from None
        ports: dict[str, tuple[str, bool]] = {}
        reasons: dict[str, str] = {}
        for i, p in enumerate(doc.get("ports", [])):
            if not isinstance(p, Mapping) or "port" not in p or "chain_present" not in p:
                raise ValueError(f"firewall report {hv}: ports[{i}] needs 'port' and 'chain_present' (got {p!r:.100})")
            ports[str(p["port"])] = (str(p.get("vm", "")), bool(p["chain_present"]))
            if p.get("reason"):
                reasons[str(p["port"])] = str(p["reason"])
        return cls(hypervisor=hv, role=str(doc.get("role", "default")), timestamp=ts, ports=ports,
                   ruleset_fingerprint=str(doc.get("ruleset_fingerprint", "")),
                   packages={str(k): str(v) for k, v in dict(doc.get("packages", {})).items()},
                   reasons=reasons, complete=bool(doc.get("complete", True)),
                   carried={str(p) for p in doc.get("carried", ())})

    def to_dict(self) -> dict[str, Any]:
        ports = []
        for p, (vm, ok) in self.ports.items():
            doc: dict[str, Any] = {"port": p, "vm": vm, "chain_present": ok}
            if p in self.reasons:
                doc["reason"] = self.reasons[p]
            ports.append(doc)
        out: dict[str, Any] = {"hypervisor": self.hypervisor, "role": self.role, "timestamp": self.timestamp,
                               "ports": ports, "ruleset_fingerprint": self.ruleset_fingerprint,
                               "packages": dict(self.packages), "complete": self.complete}
        if self.carried:   # only while a split round's package samples are due: a whole round's state as before
            out["carried"] = sorted(self.carried)
        return out

    def merged(self, later: "HypervisorReport") -> "HypervisorReport":
        """This round with a later part of it added (same hypervisor and time: the collector's records
        of one round cut across two batches): ports and packages added, the later part's value winning,
        its fingerprint once it has one, complete once a part carried the host-level sample."""
        reasons = {p: r for p, r in self.reasons.items() if p not in later.ports}
        reasons.update(later.reasons)
        return HypervisorReport(self.hypervisor, later.role, self.timestamp, {**self.ports, **later.ports},
                                later.ruleset_fingerprint or self.ruleset_fingerprint,
                                {**self.packages, **later.packages}, reasons, self.complete or later.complete,
                                self.carried - later.packages.keys())

    def carrying(self, prev: "HypervisorReport") -> "HypervisorReport":
        """This (first part of a) newer round with the host-level facts it has no sample of yet taken
        from the hypervisor's previous round, so drift does not read a partial round as "no ruleset, no
        packages" (cleared, re-opened by the rest of the round): the fingerprint until the round's
        host-level sample comes, the version of each package until the round's own (package samples
        come last). A package is carried one round at most: one the collector no longer reports goes."""
        fingerprint = self.ruleset_fingerprint
        if not self.complete:   # no host-level sample yet: no fingerprint of its own
            fingerprint = fingerprint or prev.ruleset_fingerprint
        carried = {p for p in prev.packages if p not in prev.carried and p not in self.packages}
        if fingerprint == self.ruleset_fingerprint and not carried:
            return self
        return replace(self, ruleset_fingerprint=fingerprint, carried=carried,
                       packages={**{p: prev.packages[p] for p in carried}, **self.packages})

    @property
    def unprotected(self) -> int:
        return sum(1 for _, ok in self.ports.values() if not ok)


FIREWALL_METRICS = frozenset({"iptables_vm_port", "iptables_ruleset", "iptables_software",
                              "firewall_port", "firewall_host"})
_HOST_LEVEL = frozenset({"iptables_ruleset", "firewall_host"})


def report_from_metrics(metrics: Iterable[Metric], roles: Mapping[str, str] | None = None) -> list[HypervisorReport]:
    """Group firewall samples into one report per hypervisor and round, oldest round first."""
    reports: dict[tuple[str, float], HypervisorReport] = {}
    roles = roles or {}
    for m in metrics:
        if m.name not in FIREWALL_METRICS:
            continue
        hv = m.tags.get("hypervisor") or m.tags.get("host")
        if not hv:
            continue
        if len(hv) > MAX_LABEL_VALUE:   # the hypervisor label of the gauges: bounded before it keys any state
            hv = label_value(HANDLER, "hypervisor", hv)
        rep = reports.get((hv, m.timestamp))
        if rep is None:
            rep = HypervisorReport(hv, m.tags.get("role") or roles.get(hv, "default"), m.timestamp, complete=False)
            reports[(hv, m.timestamp)] = rep
        if m.tags.get("role"):
            rep.role = label_value(HANDLER, "role", m.tags["role"])
        if m.name in _HOST_LEVEL:
            rep.complete = True
        if m.name == "iptables_vm_port":
            port = _b("port", m.tags.get("port_id") or m.tags.get("device", ""))
            protected = m.fields.get("protected")
            rep.ports[port] = (_b("vm", m.tags.get("vm", "")), bool(protected) and protected != "0")
            if m.fields.get("reason"):
                rep.reasons[port] = _b("reason", str(m.fields["reason"]))
        elif m.name == "iptables_ruleset":
            fp = m.fields.get("base_fingerprint", m.fields.get("fingerprint", ""))
            rep.ruleset_fingerprint = _b("fingerprint", str(fp))
        elif m.name == "iptables_software":
            if m.tags.get("package") and "version" in m.fields:
                rep.packages[_b("package", m.tags["package"])] = _b("version", str(m.fields["version"]))
        elif m.name == "firewall_port":
            port = _b("port", m.tags.get("port", ""))
            rep.ports[port] = (_b("vm", m.tags.get("vm", "")), bool(m.fields.get("chain_present", False)))
        elif m.name == "firewall_host":
            rep.ruleset_fingerprint = _b("fingerprint", str(m.fields.get("ruleset_fingerprint", rep.ruleset_fingerprint)))
            for k, v in m.fields.items():
                if k.startswith("pkg_"):
                    rep.packages[_b("package", k[4:])] = _b("version", str(v))
    return sorted(reports.values(), key=lambda r: (r.timestamp, r.hypervisor))


def _b(what: str, text: str) -> str:
    """A name or value the report keeps (its state, table entry, findings' where): at most a label's
    length, a prefix and a hash beyond (a 1 MB port id made one hypervisor's changelog record beyond
    Kafka's message size)."""
    return text if len(text) <= MAX_LABEL_VALUE else label_value(HANDLER, what, text)


def _majority(values: list[str]) -> str | None:
    """The most common value; None on a tie for first place (no majority to compare with)."""
    if not values:
        return None
    ranked = Counter(values).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None
    return ranked[0][0]


class FirewallDetector:
    """Keeps the last report of every hypervisor; every new report yields findings at once."""

    def __init__(self, min_role_size: int = 3, *, book: FindingBook | None = None) -> None:
        self.min_role_size = min_role_size       # drift needs a majority to compare against
        self.latest: dict[str, HypervisorReport] = {}
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh

    def update(self, report: HypervisorReport | Mapping[str, Any], drift: bool = True) -> list[Finding]:
        """Take one report; ``drift=False`` leaves the role comparison to a later :meth:`drift` call
        (a stream handler compares each role once per batch: comparing per report is quadratic)."""
        rep = report if isinstance(report, HypervisorReport) else HypervisorReport.from_dict(report)
        prev = self.latest.get(rep.hypervisor)
        if prev is not None and rep.timestamp == prev.timestamp:
            # a later part of the same round (split across batches, or handed again): added to it, so the
            # part with the host-level sample does not read the earlier part's ports as gone
            rep = prev.merged(rep)
        elif prev is not None and rep.timestamp > prev.timestamp:
            rep = rep.carrying(prev)
        self.latest[rep.hypervisor] = rep
        out = self._ports(rep)
        if drift:
            out += self._drift(rep.role, rep.timestamp)
        return out

    def drift(self, role: str, now: float) -> list[Finding]:
        """Compare the hypervisors of ``role`` with their majority (ruleset, packages) at event time ``now``."""
        return self._drift(role, now)

    def _ports(self, rep: HypervisorReport) -> list[Finding]:
        out: list[Finding] = []
        now = rep.timestamp
        keep: set[str] = set()
        for port, (vm, present) in rep.ports.items():
            where = {"hypervisor": rep.hypervisor, "port": port, "vm": vm}
            if present:
                done = self.book.clear(UNPROTECTED, where, now, "security-group chain present again")
                if done:
                    out.append(done)
                continue
            reason = rep.reasons.get(port)
            f = self.book.raise_(
                detector=UNPROTECTED, what="VM port without its security-group chain", where=where,
                observed=reason or "chain absent", expected="chain present", score=1.0, severity=Severity.CRITICAL,
                explanation=(f"port {port} of VM {vm or '?'} on {rep.hypervisor} has no working security-group "
                             "chain in iptables: the VM is reachable without its firewall rules"
                             + (f" ({reason})" if reason else "")),
                now=now, runbook=RUNBOOK)
            keep.add(_key(UNPROTECTED, where))
            out.append(f)
        # Ports that vanished from the report (VM deleted or migrated) are no longer exposed here.
        if rep.complete:
            out += self.book.clear_all_except(UNPROTECTED, keep, now, "port no longer on this hypervisor",
                                              match={"hypervisor": rep.hypervisor})
        return out

    def _drift(self, role: str, now: float) -> list[Finding]:
        members = [r for r in self.latest.values() if r.role == role]
        # The role's newest report, not the caller's: the role's findings are about every member, and a
        # batch of a partition lagging behind another brought older times, stamping a finding back in time
        # (re-opened before its clear: the paging actuator drops such a record as older than the clear).
        now = max([now, *(r.timestamp for r in members)])
        out: list[Finding] = []
        keep: set[str] = set()
        if len(members) >= self.min_role_size:
            fp_major = _majority([r.ruleset_fingerprint for r in members if r.ruleset_fingerprint])
            for r in members:
                if fp_major and r.ruleset_fingerprint and r.ruleset_fingerprint != fp_major:
                    where = {"hypervisor": r.hypervisor, "role": role}
                    out.append(self.book.raise_(
                        detector=FINGERPRINT_DRIFT, what="ruleset differs from the other hypervisors of its role",
                        where=where, observed=r.ruleset_fingerprint[:16], expected=fp_major[:16], score=0.7,
                        severity=Severity.WARNING,
                        explanation=(f"{r.hypervisor} ruleset fingerprint {r.ruleset_fingerprint[:12]} differs "
                                     f"from the {role} majority {fp_major[:12]}"), now=now, runbook=RUNBOOK))
                    keep.add(_key(FINGERPRINT_DRIFT, where))
            packages = sorted({p for r in members for p in r.packages})
            for pkg in packages:
                major = _majority([r.packages[pkg] for r in members if pkg in r.packages])
                if major is None:
                    continue
                for r in members:
                    version = r.packages.get(pkg)
                    if version is None or version == major:
                        continue
                    where = {"hypervisor": r.hypervisor, "role": role, "package": pkg}
                    out.append(self.book.raise_(
                        detector=PACKAGE_DRIFT, what="package version differs from the other hypervisors",
                        where=where, observed=version, expected=major, score=0.6, severity=Severity.WARNING,
                        explanation=f"{pkg} {version} on {r.hypervisor}; {major} on most {role} hypervisors",
                        now=now, runbook=RUNBOOK))
                    keep.add(_key(PACKAGE_DRIFT, where))
        for det in (FINGERPRINT_DRIFT, PACKAGE_DRIFT):
            out += self.book.clear_all_except(det, keep, now, "in line with its role again", match={"role": role})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"min_role_size": self.min_role_size,
                "latest": {hv: r.to_dict() for hv, r in self.latest.items()},
                "book": self.book.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> "FirewallDetector":
        det = cls(int(doc.get("min_role_size", 3)), book=FindingBook.from_dict(doc.get("book", {})))
        det.latest = {hv: HypervisorReport.from_dict(r) for hv, r in doc.get("latest", {}).items()}
        return det

    # -------------------------------------------------------------- per-hypervisor state parts
    def state_of(self, hypervisor: str) -> dict[str, Any] | None:
        """The hypervisor's last report and the open findings about it (None: nothing known)."""
        rep = self.latest.get(hypervisor)
        book = self.book.split("hypervisor").get(hypervisor, FindingBook())
        if rep is None and not book.open:
            return None
        return {"report": rep.to_dict() if rep else None, "book": book.to_dict()}

    def restore_part(self, hypervisor: str, doc: Mapping[str, Any]) -> None:
        """Take back a part :meth:`state_of` wrote, every field checked first (StateError naming it: nothing
        of the part is taken then)."""
        report = doc.get("report")
        rep = None if report is None else _stored_report(report, hypervisor)
        book = FindingBook.from_dict(doc.get("book", {}), self.book.refresh_s)
        book.check_about({"hypervisor": hypervisor})
        if rep is not None:
            self.latest[hypervisor] = rep
        self.book.merge(book)


def _stored_report(doc: Any, hypervisor: str) -> HypervisorReport:
    """A report as :meth:`HypervisorReport.to_dict` wrote it for ``hypervisor``, or StateError naming the field
    (``from_dict`` reads a report given as input, more leniently: ``str()`` or ``bool()`` of anything)."""
    doc = obj(doc, "report")
    if text(get(doc, "hypervisor", "report"), "report.hypervisor") != hypervisor:
        raise StateError("report.hypervisor", f"{doc['hypervisor']!r:.60} in the state of {hypervisor!r:.60}")
    event_time(get(doc, "timestamp", "report"), "report.timestamp")
    text(doc.get("role", "default"), "report.role")
    for i, p in enumerate(items(doc.get("ports", []), "report.ports")):
        where = f"report.ports[{i}]"
        p = obj(p, where)
        text(get(p, "port", where), f"{where}.port")
        text(p.get("vm", ""), f"{where}.vm")
        flag(get(p, "chain_present", where), f"{where}.chain_present")
        if p.get("reason") is not None:
            text(p["reason"], f"{where}.reason")
    text(doc.get("ruleset_fingerprint", ""), "report.ruleset_fingerprint")
    texts(doc.get("packages", {}), "report.packages")
    flag(doc.get("complete", True), "report.complete")
    for i, c in enumerate(items(doc.get("carried", []), "report.carried")):
        text(c, f"report.carried[{i}]")
    return HypervisorReport.from_dict(doc)

