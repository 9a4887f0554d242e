"""netperf detector: throughput drops against the baseline, and queue counts that stop paying off.

"Tuning Virtualized Network Node: multi-queue virtio-net" (docs/sources.md): six parallel TCP_STREAM
runs summed, each figure the mean of ten runs. Old kernel, queues 1/2/4/8: 3.28/3.41/3.51/3.57 Gb/s
(no scaling, one core busy); new kernel: 3.23/6.00/8.02/8.42 Gb/s. Two findings come out of that:

* ``netperf.throughput_drop`` (warning): a result below ``(1 - drop_ratio)`` times the baseline of
  the same target set, label and queue count. The baseline is the median of the last
  ``baseline_runs`` accepted results; results that dropped are not accepted, so a lasting
  regression stays open until throughput recovers (~8.4 -> ~3.5 Gb/s is caught at once).
* ``netperf.no_queue_scaling`` (warning): for one target set and label, the latest results per
  queue count span at least ``min_queue_ratio`` (4x) queues but the throughput of the most queues
  is less than ``min_speedup`` (1.5x) the throughput of the fewest. Old kernel: 3.57/3.28 = 1.09
  flags; new kernel: 8.42/3.23 = 2.6 does not.

Input: ``collectors/netperf``'s ``netperf_throughput{host, target_set, driver, test, <labels>}`` with
field ``mean_gbps`` (the mean of the runs' summed throughput); its labels travel as tags, ``queues``
among them, and every other tag except ``host`` makes up the comparison ``label`` (e.g.
``driver=netperf,kernel=4.4.0,test=TCP_STREAM``), so only like is compared with like. ``mean_gbps`` is only
ever made of complete runs; a target dead for the whole measurement is left out of them (the collector's
``dead_targets``/``dead``: the sum is bounded by the path under test, 8.42 Gb/s over six VMs, 8.75 over
twelve). Such a result is compared with the baseline (its finding names the dead targets) and counts in the
queue scaling, but does not join the baseline, which stays the whole set's. Before, any result with
``failed_targets`` > 0 was skipped: one dead VM hid the set's throughput for as long as it stayed dead (one
without ``dead_targets``, from an older collector, still is). Also accepted:
``netperf{target_set, label, queues}`` with ``throughput_gbps_mean`` or ``throughput_gbps``, or the
same as a plain dict (``NetperfResult.from_mapping``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from opsloop.records import Finding, Severity
from opsloop.labels import label_string
from opsloop.records import Metric

from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.state_check import MAX_COUNT, StateError, count, items, obj, real

DROP = "netperf.throughput_drop"
NO_SCALING = "netperf.no_queue_scaling"
RUNBOOK = "runbooks/netperf.md"
VALUE_FIELDS = ("throughput_gbps_mean", "throughput_gbps", "mean_gbps")
SET_METRIC = "netperf_throughput"
# The largest throughput a result may report: 100 Tb/s, far beyond any NIC or bond. Beyond it (1e308 is
# valid on the wire) it is a corrupt reading: refused, or it became the baseline and every finding of the
# series carried it.
MAX_GBPS = 1e5
# The longest queue count (its decimal text, a sign included) a result or a stored state may carry. Beyond it
# (a tag of 25 digits) it was taken at ingest and refused by every restore: the set started afresh at each restart.
MAX_QUEUES_LEN = 20
# The dead targets' names kept of a result (shown in a finding's explanation).
MAX_DEAD_SHOWN = 300
# Tags that identify neither the configuration under test nor the series.
_NOT_LABELS = frozenset({"host", "target_set", "queues", "label", "opsloop_topic"})


@dataclass(frozen=True, slots=True)
class NetperfResult:
    target_set: str
    label: str
    queues: int | None
    gbps: float
    timestamp: float
    targets: int | None = None   # in the set (the collector's ``targets``)
    dead_targets: int = 0        # of them, left out: they answered in no run
    dead: str = ""               # their names, comma-separated

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> "NetperfResult":
        value = next((doc[f] for f in VALUE_FIELDS if f in doc), None)
        try:
            gbps = float(value)  # type: ignore[arg-type]
            q = doc.get("queues")
            result = cls(target_set=str(doc.get("target_set", "default")), label=str(doc.get("label", "")),
                         queues=None if q in (None, "") else int(q), gbps=gbps, timestamp=float(doc["timestamp"]),
                         targets=_count_field(doc, "targets"), dead_targets=_count_field(doc, "dead_targets") or 0,
                         dead=str(doc.get("dead", ""))[:MAX_DEAD_SHOWN])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"netperf result needs timestamp and one of {VALUE_FIELDS} as numbers, "
                             f"queues, targets and dead_targets as integers (got {dict(doc)!r:.200})") from None
        if result.targets is not None and result.dead_targets >= result.targets:
            raise ValueError(f"netperf result: {result.dead_targets} dead of {result.targets} targets leaves none "
                             f"to have measured its throughput (got {dict(doc)!r:.200})")
        if result.queues is not None and len(str(result.queues)) > MAX_QUEUES_LEN:
            raise ValueError(f"netperf result: queues {q!r:.60} is not a queue count (at most {MAX_QUEUES_LEN} "
                             f"characters; got {dict(doc)!r:.200})")
        if not 0.0 <= gbps <= MAX_GBPS:   # also refuses nan
            raise ValueError(f"netperf result: throughput {value!r:.60} Gb/s is not a plausible reading "
                             f"(expected 0 to {MAX_GBPS:g}; got {dict(doc)!r:.200})")
        return result

    @classmethod
    def from_metric(cls, m: Metric) -> "NetperfResult":
        doc: dict[str, Any] = {**m.tags, **m.fields, "timestamp": m.timestamp}
        if m.name == SET_METRIC and "label" not in m.tags:
            doc["label"] = label_string(m.tags, skip=_NOT_LABELS)
        return cls.from_mapping(doc)

    @property
    def measured_over(self) -> str:
        """What the throughput was measured over, when some targets were left out ("" when none was)."""
        if not self.dead_targets:
            return ""
        of = f" of {self.targets}" if self.targets is not None else ""
        live = f"{self.targets - self.dead_targets}{of}" if self.targets is not None else "the other"
        return f"; measured over {live} targets, {self.dead_targets} dead (answered in no run): {self.dead}"

    @property
    def where(self) -> dict[str, str]:
        where = {"target_set": self.target_set, "label": self.label}
        if self.queues is not None:
            where["queues"] = str(self.queues)
        return where


def _count_field(doc: Mapping[str, Any], name: str) -> int | None:
    """An optional count of the result (None when absent); ValueError for one that is no count."""
    v = doc.get(name)
    return None if v is None else count(v, name)


def result_from_metric(m: Metric) -> NetperfResult | None:
    """The result a sample carries, or None for samples that are not a usable set result.

    Raises ValueError for a result sample whose throughput or queues cannot be read.
    """
    if m.name == SET_METRIC:
        if "mean_gbps" not in m.fields:   # no complete run: only partial sums (a lower bound) or failures
            return None
        failed = m.fields.get("failed_targets", 0)
        if "dead_targets" not in m.fields and isinstance(failed, (int, float)) and failed > 0:
            return None   # a collector that does not say which targets its mean left out: not read, as before
    elif m.name != "netperf":
        return None
    return NetperfResult.from_metric(m)


class NetperfDetector:
    def __init__(self, drop_ratio: float = 0.2, baseline_runs: int = 5, min_baseline_runs: int = 1,
                 min_speedup: float = 1.5, min_queue_ratio: int = 4, *, book: FindingBook | None = None) -> None:
        self.drop_ratio = drop_ratio
        self.baseline_runs = baseline_runs
        self.min_baseline_runs = min_baseline_runs
        self.min_speedup = min_speedup
        self.min_queue_ratio = min_queue_ratio
        self.history: dict[str, list[float]] = {}            # series -> accepted results (bounded)
        self.by_queues: dict[str, dict[str, float]] = {}     # target_set|label -> {queues: latest gbps}
        self.book = book if book is not None else FindingBook()   # the handler's, with its refresh

    def update(self, result: NetperfResult | Metric | Mapping[str, Any]) -> list[Finding]:
        if isinstance(result, Metric):
            result = NetperfResult.from_metric(result)
        elif not isinstance(result, NetperfResult):
            result = NetperfResult.from_mapping(result)
        out = self._drop(result)
        if result.queues is not None:
            out += self._scaling(result)
        return out

    def baseline(self, r: NetperfResult) -> float | None:
        """The current baseline (median of accepted results) of ``r``'s series, if any."""
        hist = self.history.get("|".join(r.where.values()))
        return statistics.median(hist) if hist else None

    def speedup(self, target_set: str, label: str) -> tuple[int, int, float] | None:
        """(fewest queues, most queues, throughput ratio most/fewest) from the latest results."""
        latest = self.by_queues.get(f"{target_set}|{label}", {})
        qs = sorted(int(q) for q in latest)
        if len(qs) < 2 or latest[str(qs[0])] <= 0:
            return None
        return qs[0], qs[-1], latest[str(qs[-1])] / latest[str(qs[0])]

    def _drop(self, r: NetperfResult) -> list[Finding]:
        where = r.where
        key = "|".join(where.values())
        hist = self.history.setdefault(key, [])
        if len(hist) < self.min_baseline_runs:
            if not r.dead_targets:   # the baseline is the whole set's (module docstring)
                hist.append(r.gbps)
            return []
        baseline = statistics.median(hist)
        floor = (1.0 - self.drop_ratio) * baseline
        if r.gbps < floor:
            drop = 1.0 - r.gbps / baseline if baseline > 0 else 1.0
            return [self.book.raise_(
                detector=DROP, what="network throughput dropped below its baseline", where=where,
                observed=round(r.gbps, 3), expected=round(baseline, 3),
                score=min(1.0, drop / (2 * self.drop_ratio)), severity=Severity.WARNING,
                explanation=(f"{r.gbps:.2f} Gb/s vs baseline {baseline:.2f} Gb/s ({drop:.0%} lower; "
                             f"threshold {self.drop_ratio:.0%}) for {r.target_set}/{r.label}"
                             + (f" with {r.queues} queues" if r.queues is not None else "") + r.measured_over),
                now=r.timestamp, runbook=RUNBOOK)]
        if not r.dead_targets:
            hist.append(r.gbps)
            del hist[:-self.baseline_runs]
        done = self.book.clear(DROP, where, r.timestamp, f"{r.gbps:.2f} Gb/s is back near the baseline")
        return [done] if done else []

    def _scaling(self, r: NetperfResult) -> list[Finding]:
        key = f"{r.target_set}|{r.label}"
        latest = self.by_queues.setdefault(key, {})
        latest[str(r.queues)] = r.gbps
        where = {"target_set": r.target_set, "label": r.label}
        qs = sorted(int(q) for q in latest)
        if len(qs) < 2 or qs[0] <= 0 or qs[-1] < self.min_queue_ratio * qs[0]:
            return []
        lo, hi = latest[str(qs[0])], latest[str(qs[-1])]
        speedup = hi / lo if lo > 0 else float("inf")
        table = ", ".join(f"{q}: {latest[str(q)]:.2f}" for q in qs)
        if speedup < self.min_speedup:
            return [self.book.raise_(
                detector=NO_SCALING, what="throughput does not scale with the number of queues", where=where,
                observed=round(speedup, 3), expected=self.min_speedup,
                score=min(1.0, (self.min_speedup - speedup) / (self.min_speedup - 1.0)),
                severity=Severity.WARNING,
                explanation=(f"{qs[-1]} queues give {speedup:.2f}x the throughput of {qs[0]} "
                             f"(expected >= {self.min_speedup}x); Gb/s per queue count: {table}. "
                             "Likely one core forwarding everything (old kernel / OVS datapath, "
                             "multi-queue not enabled)"),
                now=r.timestamp, runbook=RUNBOOK)]
        done = self.book.clear(NO_SCALING, where, r.timestamp, f"scales again: {table}")
        return [done] if done else []

    def to_dict(self) -> dict[str, Any]:
        return {"config": {"drop_ratio": self.drop_ratio, "baseline_runs": self.baseline_runs,
                           "min_baseline_runs": self.min_baseline_runs, "min_speedup": self.min_speedup,
                           "min_queue_ratio": self.min_queue_ratio},
                "history": self.history, "by_queues": self.by_queues, "book": self.book.to_dict()}

    @classmethod
    def from_dict(cls, doc: Any, field: str = "detector") -> "NetperfDetector":
        """The detector of a :meth:`to_dict` state, every field checked first (StateError naming it). Before,
        a damaged one loaded: a drop ratio of 0 or a baseline length of 0.5 raised at every later result of
        the target set, a queue count that was no integer at every speedup."""
        doc = obj(doc, field)
        config = obj(doc.get("config", {}), f"{field}.config")
        unknown = sorted(set(config) - set(_CONFIG))
        if unknown:
            raise StateError(f"{field}.config.{unknown[0]}", "not a setting of the netperf detector")
        checked: dict[str, Any] = {}
        for name, value in config.items():
            kind, lo, hi, above, below = _CONFIG[name]
            where = f"{field}.config.{name}"
            checked[name] = (count(value, where, int(lo), int(hi)) if kind is int
                             else real(value, where, lo, hi, above=above, below=below))
        det = cls(**checked, book=FindingBook.from_dict(doc.get("book", {}), field=f"{field}.book"))
        longest = max(det.baseline_runs, det.min_baseline_runs)
        for key, values in obj(doc.get("history", {}), f"{field}.history").items():
            where = f"{field}.history[{key!r}]"
            det.history[key] = [real(v, f"{where}[{i}]", 0.0, MAX_GBPS)
                                for i, v in enumerate(items(values, where, longest))]
        for key, latest in obj(doc.get("by_queues", {}), f"{field}.by_queues").items():
            where = f"{field}.by_queues[{key!r}]"
            det.by_queues[key] = {_queues(q, f"{where}[{q!r}]"): real(v, f"{where}[{q!r}]", 0.0, MAX_GBPS)
                                  for q, v in obj(latest, where).items()}
        return det


# the settings of a stored detector: (type, low, high, low excluded, high excluded), as NetperfSettings
_CONFIG: dict[str, tuple[type, float, float, bool, bool]] = {
    "drop_ratio": (float, 0.0, 1.0, True, True), "baseline_runs": (int, 1, MAX_COUNT, False, False),
    "min_baseline_runs": (int, 1, MAX_COUNT, False, False), "min_speedup": (float, 1.0, 1e6, True, False),
    "min_queue_ratio": (int, 2, MAX_COUNT, False, False)}


def _queues(q: str, field: str) -> str:
    """A queue count as ``by_queues`` keys it (``str(int)``), or StateError."""
    try:
        ok = str(int(q)) == q
    except ValueError:
        ok = False
    if not ok or len(q) > MAX_QUEUES_LEN:
        raise StateError(field, "not a queue count")
    return q
