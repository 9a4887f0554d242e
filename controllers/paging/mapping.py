"""A finding as an Alertmanager alert: labels say which problem and where, annotations say the rest.

Labels (identity: the same finding always maps to the same label set, so Alertmanager keeps one
alert however often it is re-sent): ``alertname`` from the detector (``firewall.unprotected_port``
-> ``FirewallUnprotectedPort``), ``severity``, ``signal`` (the detector's family), ``detector``,
``source="opsloop-paging"`` and the finding's where-labels (``hypervisor``, ``vm``, ``host`` ...).
Annotations: summary, description (observed vs expected and the explanation), what, observed,
expected, explanation, runbook_url, dashboard_url (the names the alert rules use), finding_id, first_seen.

Sizes are bounded so that a finding with many labels or very long names still pages: at most
``MAX_WHERE_LABELS`` where-labels (the rest dropped), names and values shortened with a hash of the
full text (so two findings that differ only past the cut stay two alerts); the annotation
``labels_truncated`` says what was cut, and the dropped labels are still in the description. Where-keys
that clean to one label name (``a-b``, ``a.b``, ``a_b``) get distinct names (:func:`distinct_label_names`:
a valid key keeps its own, the others a hash suffix; ``labels_truncated`` says so): one overwrote the other.

What Alertmanager refuses is not built (it answers 400 to a label set or times it does not take, 422 to
a ``generatorURL`` it cannot parse, and drops the alert): where-keys become valid label names (above),
``startsAt`` is never after ``endsAt`` (a producer's clock ahead, or ours stepped back: the finding's own
``first_seen`` stays in the annotation of that name), times are RFC 3339 with a four-digit year, and the
``generatorURL`` is the dashboard link only when it is an absolute http(s) URL Alertmanager parses (else
empty; the ``dashboard_url`` annotation keeps the link as given).

An alert Alertmanager still refuses (a state file written by an older version, a stricter Alertmanager)
is replaced by its fallback (:func:`fallback_labels`, :func:`fallback_annotations`): alertname
``OpsloopPageRejected``, the same routing labels cleaned, the finding id and the rejection reason.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urljoin

from opsloop.labels import MAX_LABEL_VALUE, shorten
from opsloop.records import Finding, Severity
from opsloop.runbooks import dashboard_base_url, runbook_base_url

SOURCE = "opsloop-paging"
RESERVED_LABELS = frozenset({"alertname", "severity", "signal", "detector", "source", "backstop"})
# MAX_LABEL_VALUE, shorten: core (opsloop.labels), the stream worker exports where-labels with the same bound
MAX_LABEL_NAME = 100
MAX_ALERTNAME = 120
MAX_WHERE_LABELS = 20     # plus the five we set: well inside the audit record's 32 labels
MAX_ANNOTATION = 2048
MAX_REJECTION_REASON = 500
FALLBACK_ALERTNAME = "OpsloopPageRejected"
_LABEL_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# An absolute http(s) URL Alertmanager's API takes as generatorURL (Go's url.ParseRequestURI): a plain host
# (or [IPv6]), digits after its colon, printable ASCII after it; every % starts an escape (checked apart).
# Narrower than what Go accepts: a link left out costs nothing (the dashboard_url annotation keeps it),
# one Go refuses costs the whole POST (422).
_GENERATOR_URL = re.compile(r"https?://(?:[A-Za-z0-9\-._~!$&'()*+,;=]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]*)?"
                            r"(?:[/?#][\x21-\x7e]*)?", re.ASCII)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")

# Dashboard UID per signal (dashboards/ provisions them); unknown signals go to the pipeline board.
DASHBOARDS = {
    "power": "opsloop-power/fleet-power",
    "netperf": "opsloop-netperf/network-throughput",
    "keystone": "opsloop-keystone/keystone-load",
    "firewall": "opsloop-firewall/firewall-coverage",
    "edge": "opsloop-edge/edge-weights",
}
DEFAULT_DASHBOARD = "opsloop-pipeline/pipeline-health"


@dataclass(frozen=True, slots=True)
class Links:
    dashboard_base_url: str = field(default_factory=dashboard_base_url)
    runbook_base_url: str = field(default_factory=runbook_base_url)


def alertname_for(detector: str) -> str:
    """``firewall.unprotected_port`` -> ``FirewallUnprotectedPort`` (a valid, readable alert name)."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", detector) if p]
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "Finding"
    return name if name[0].isalpha() else f"Finding{name}"


def signal_for(detector: str) -> str:
    return detector.split(".", 1)[0] or "finding"


def label_name(key: str) -> str:
    """A where-key as a Prometheus label name; names we set ourselves get a ``where_`` prefix."""
    name = _LABEL_NAME_BAD.sub("_", key) or "_"
    if name[0].isdigit():
        name = "_" + name
    if name in RESERVED_LABELS or name.startswith("__"):
        name = "where_" + name.lstrip("_")
    return name


def distinct_label_names(keys: list[str], clean: Callable[[str], str],
                         taken: frozenset[str] = frozenset()) -> dict[str, str]:
    """A label name per key, ``clean(key)`` unless that is in ``taken`` or another key's: keys that clean to one
    name (``a-b``, ``a.b``, ``a_b``) each keep their value (one overwrote the other's). A key that is its own
    name keeps it; the others, in key order, get ``_`` and a hash of the key instead: the same keys always get
    the same names, so an alert keeps its identity."""
    used: set[str] = set(taken)
    out: dict[str, str] = {}
    for key in sorted(keys, key=lambda k: (clean(k) != k, k)):
        name = base = clean(key)
        n = 0
        while name in used:   # a second round only if a name with this very suffix is taken too
            digest = hashlib.sha1(f"{key}|{n}".encode("utf-8", "replace")).hexdigest()[:8]
            name, n = base[:MAX_LABEL_NAME - 9] + "_" + digest, n + 1
        used.add(name)
        out[key] = name
    return out


def _where_name(key: str) -> str:
    return shorten(label_name(key), MAX_LABEL_NAME)


def labels_and_cuts(finding: Finding) -> tuple[dict[str, str], str]:
    """The alert's labels, bounded, and a note of what was cut ("" when nothing was)."""
    cuts: list[str] = []
    where = sorted(finding.where.items())
    kept, dropped = where[:MAX_WHERE_LABELS], where[MAX_WHERE_LABELS:]
    if dropped:
        cuts.append(f"dropped {len(dropped)} where-labels beyond {MAX_WHERE_LABELS}: "
                    + ", ".join(k for k, _ in dropped))
    labels: dict[str, str] = {}
    names = distinct_label_names([k for k, _ in kept], _where_name, RESERVED_LABELS)
    for k, v in kept:
        name = names[k]
        labels[name] = shorten(str(v), MAX_LABEL_VALUE)
        if name != _where_name(k):
            cuts.append(f"renamed {k[:40]} to {name}: {label_name(k)[:40]} is another where-key's label")
        elif name != label_name(k) or labels[name] != str(v):
            cuts.append(f"shortened {label_name(k)[:40]}")
    alertname = shorten(alertname_for(finding.detector), MAX_ALERTNAME)
    detector = shorten(finding.detector, MAX_LABEL_VALUE)
    signal = shorten(signal_for(finding.detector), MAX_LABEL_VALUE)
    if alertname != alertname_for(finding.detector):
        cuts.append(f"shortened alertname to {MAX_ALERTNAME} characters")
    if detector != finding.detector:
        cuts.append(f"shortened detector to {MAX_LABEL_VALUE} characters")
    labels.update(alertname=alertname, severity=finding.severity.value, signal=signal, detector=detector,
                  source=SOURCE)
    return labels, "; ".join(cuts)


def labels_for(finding: Finding) -> dict[str, str]:
    return labels_and_cuts(finding)[0]


def _where_text(finding: Finding) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(finding.where.items())) or "everywhere"


def _fmt(v: float | str | None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def dashboard_url(finding: Finding, links: Links) -> str:
    if finding.dashboard.startswith(("http://", "https://")):
        return finding.dashboard
    board = DASHBOARDS.get(signal_for(finding.detector), DEFAULT_DASHBOARD)
    query = "&".join(f"var-{quote(label_name(k))}={quote(str(v))}" for k, v in sorted(finding.where.items()))
    return f"{links.dashboard_base_url.rstrip('/')}/d/{board}" + (f"?{query}" if query else "")


def runbook_url(finding: Finding, links: Links) -> str:
    """The finding's runbook (absolute, or relative to the runbook base), else one per detector."""
    base = links.runbook_base_url if links.runbook_base_url.endswith("/") else links.runbook_base_url + "/"
    if finding.runbook:
        return urljoin(base, finding.runbook)
    return urljoin(base, f"runbooks/{signal_for(finding.detector)}.md#{alertname_for(finding.detector).lower()}")


def annotations_for(finding: Finding, links: Links) -> dict[str, str]:
    observed, expected = _fmt(finding.observed), _fmt(finding.expected)
    where = _where_text(finding)
    description = f"Observed: {observed}. Expected: {expected}."
    if finding.explanation:
        description += f" {finding.explanation}"
    doc = {
        "summary": f"{finding.what} ({where}): observed {observed}, expected {expected}",
        "description": description,
        "what": finding.what,
        "observed": observed,
        "expected": expected,
        "explanation": finding.explanation,
        "runbook_url": runbook_url(finding, links),
        "dashboard_url": dashboard_url(finding, links),
        "finding_id": finding.id,
        "first_seen": iso(finding.first_seen),
    }
    cuts = labels_and_cuts(finding)[1]
    if cuts:
        doc["labels_truncated"] = cuts
    return {k: v[:MAX_ANNOTATION] for k, v in doc.items()}


def iso(ts: float) -> str:
    """RFC 3339 in UTC with milliseconds, as Alertmanager's API expects (a four-digit year: strftime wrote
    year 68 as ``68``, which Alertmanager refuses)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generator_url(url: str) -> str:
    """``url`` when Alertmanager takes it as an alert's generatorURL, else "" (see ``_GENERATOR_URL``)."""
    return url if _GENERATOR_URL.fullmatch(url) and not _BAD_ESCAPE.search(url) else ""


def postable(labels: dict[str, str], annotations: dict[str, str], starts_at: float, ends_at: float) -> dict[str, Any]:
    """One element of the ``POST /api/v2/alerts`` body.

    ``startsAt`` is at most ``endsAt`` (Alertmanager refuses an alert ending before it starts: a resolve of a
    finding stamped by a clock ahead of ours was dropped, and the page stayed open until it expired).
    """
    return {"labels": labels, "annotations": annotations, "startsAt": iso(min(starts_at, ends_at)),
            "endsAt": iso(ends_at), "generatorURL": generator_url(annotations.get("dashboard_url", ""))}


# -- the fallback of an alert Alertmanager refused ----------------------------------------------------
def _text(value: object, limit: int) -> str:
    """``value`` as valid UTF-8 text of at most ``limit`` characters."""
    return str(value).encode("utf-8", "replace").decode("utf-8")[:limit]


def is_fallback(labels: dict[str, str]) -> bool:
    return labels.get("alertname") == FALLBACK_ALERTNAME and "rejected_alertname" in labels


_FALLBACK_OWN = frozenset({"alertname", "severity", "source", "finding_id", "rejected_alertname"})


def _fallback_name(key: str) -> str:
    """A refused alert's label name as the fallback's: valid names as they are, ours prefixed ``where_``."""
    name = shorten(key if _LABEL_NAME.fullmatch(key) else label_name(key), MAX_LABEL_NAME)
    return "where_" + name if name in _FALLBACK_OWN else name


def fallback_labels(labels: dict[str, str], finding_id: str) -> dict[str, str]:
    """The labels of the alert sent in place of one with ``labels`` that Alertmanager refused.

    Alertname ``OpsloopPageRejected``; severity copied when it is one of ours, else ``critical``; ``source``,
    ``finding_id`` and ``rejected_alertname``; the other labels (signal, detector, where-labels: the same
    routes, inhibitions and mute times) with names made valid and values bounded. A function of the refused
    labels and the finding id only: the fallback of a firing alert and of its resolve are one alert.
    """
    values: dict[str, str] = {}
    for key, value in sorted(labels.items(), key=lambda kv: str(kv[0])):
        key = _text(key, 10 * MAX_LABEL_NAME)
        text = shorten(_text(value, 10 * MAX_LABEL_VALUE), MAX_LABEL_VALUE)
        if text and key not in ("alertname", "severity", "source") and key not in values:
            values[key] = text
    kept = list(values)[:MAX_WHERE_LABELS + 2]   # + signal, detector
    names = distinct_label_names(kept, _fallback_name, _FALLBACK_OWN)
    out = {names[k]: values[k] for k in kept}
    severity = labels.get("severity")
    out.update(alertname=FALLBACK_ALERTNAME,
               severity=severity if severity in {s.value for s in Severity} else Severity.CRITICAL.value,
               source=SOURCE, finding_id=shorten(_text(finding_id, 1000), MAX_LABEL_VALUE) or "unknown",
               rejected_alertname=shorten(_text(labels.get("alertname", ""), 1000), MAX_LABEL_VALUE) or "unknown")
    return out


def fallback_annotations(labels: dict[str, str], annotations: dict[str, str], finding_id: str,
                         reason: str) -> dict[str, str]:
    """The annotations of the fallback: what the refused alert said, why Alertmanager refused it."""
    name = labels.get("alertname", "")
    reason = _text(reason, MAX_REJECTION_REASON)
    doc = {
        "summary": f"Alertmanager rejected the page {name} of finding {finding_id}: "
                   f"{annotations.get('summary') or 'see the finding'}",
        "description": f"{annotations.get('description', '')} This alert stands in for {name}, which "
                       f"Alertmanager rejected ({reason}); it resolves when the finding clears.".strip(),
        "rejection_reason": reason,
        "rejected_alertname": name,
        "finding_id": finding_id,
    }
    for key in ("what", "observed", "expected", "explanation", "runbook_url", "dashboard_url", "first_seen"):
        doc[key] = annotations.get(key, "")
    return {k: _text(v, MAX_ANNOTATION) for k, v in doc.items() if v}


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
