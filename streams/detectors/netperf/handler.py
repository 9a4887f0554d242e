"""netperf agent: ``telemetry.netperf`` -> throughput drops against the baseline, queues that stop paying off.

Feeds ``opsloop.streams.detectors.netperf.detector.NetperfDetector`` (one per target set: the state key) with the
collector's set results (``result_from_metric``). Gauges (labels target_set, label, queues):

* ``opsloop_netperf_throughput_bytes_per_second``: the last result;
* ``opsloop_netperf_baseline_bytes_per_second``: the baseline it is compared with (median of accepted results);
* ``opsloop_netperf_throughput_ratio``: result / baseline (the published regression: ~3.5 / ~8.4 = 0.42);
* ``opsloop_netperf_queue_speedup{target_set, label}``: throughput with the most queues over the fewest;
* ``opsloop_netperf_dead_targets``: the targets of the last result that answered in no run, left out of its
  throughput (the collector's ``dead_targets``): the result still counts, the dead VM stays visible.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from prometheus_client import Gauge

from opsloop.records import Metric
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler, drop_children
from opsloop.streams.detectors.netperf.settings import NetperfSettings
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.state_check import event_time, get, obj
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, label_value
from opsloop.streams.detectors.netperf.detector import SET_METRIC, NetperfDetector, NetperfResult, result_from_metric

SERIES = ["target_set", "label", "queues"]
BYTES_PER_GBIT = 1e9 / 8   # the wire and the detector use Gb/s; Prometheus gets bytes per second
THROUGHPUT = Gauge("opsloop_netperf_throughput_bytes_per_second", "Last throughput result of a target set", SERIES)
BASELINE = Gauge("opsloop_netperf_baseline_bytes_per_second", "Baseline throughput of the series", SERIES)
RATIO = Gauge("opsloop_netperf_throughput_ratio", "Last result divided by the baseline", SERIES)
DEAD = Gauge("opsloop_netperf_dead_targets", "Targets of the last result that answered in no run (left out of it)",
             SERIES)
SPEEDUP = Gauge("opsloop_netperf_queue_speedup", "Throughput with the most queues over the fewest",
                ["target_set", "label", "queues_low", "queues_high"])


class NetperfHandler(DetectorHandler):
    name = "netperf-detector"
    topics = (Topic.NETPERF,)
    key_label = "target_set"
    names = frozenset((SET_METRIC, "netperf"))   # what result_from_metric reads

    def __init__(self, settings: NetperfSettings | None = None, refresh_s: float = 300.0) -> None:
        super().__init__()
        self.settings = settings or NetperfSettings()
        self.refresh_s = refresh_s
        self.detectors: dict[str, NetperfDetector] = {}
        # target set -> series -> event time of its last result (replay guard); by set, not by the series
        # text's first field: a set named with a '|' leaked its entries or took another set's
        self.last_ts: dict[str, dict[str, float]] = {}
        self._speedup_shown: dict[tuple[str, str], tuple[str, str]] = {}

    def _new_detector(self) -> NetperfDetector:
        s = self.settings
        return NetperfDetector(drop_ratio=s.drop_ratio, baseline_runs=s.baseline_runs, min_speedup=s.min_speedup,
                               min_queue_ratio=s.min_queue_ratio, book=FindingBook(self.refresh_s))

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        for m in metrics:
            try:
                r = result_from_metric(m)
            except ValueError as e:
                self.reject("netperf_sample_rejected", m, str(e))
                continue
            if r is None:
                continue
            if len(r.target_set) > MAX_LABEL_VALUE or len(r.label) > MAX_LABEL_VALUE:   # label values
                r = replace(r, target_set=label_value(self.name, "target_set", r.target_set),
                            label=label_value(self.name, "label", r.label))
            series = "|".join(r.where.values())
            seen = self.last_ts.setdefault(r.target_set, {})
            if self.is_replay(r.timestamp, seen.get(series)):
                continue   # replayed after a crash: already in the baseline
            seen[series] = r.timestamp
            det = self.detectors.get(r.target_set)
            if det is None:
                det = self.detectors[r.target_set] = self._new_detector()
            det.update(r)
            self.touch(r.target_set)
            self._show(det, r)

    def _show(self, det: NetperfDetector, r: NetperfResult) -> None:
        labels = (r.target_set, r.label, "" if r.queues is None else str(r.queues))
        THROUGHPUT.labels(*labels).set(r.gbps * BYTES_PER_GBIT)
        DEAD.labels(*labels).set(r.dead_targets)
        base = det.baseline(r)
        if base is not None and base > 0:
            BASELINE.labels(*labels).set(base * BYTES_PER_GBIT)
            RATIO.labels(*labels).set(r.gbps / base)
        sp = det.speedup(r.target_set, r.label)
        if sp is not None:
            lo, hi, ratio = sp
            key, qs = (r.target_set, r.label), (str(lo), str(hi))
            old = self._speedup_shown.get(key)
            if old is not None and old != qs:
                try:
                    SPEEDUP.remove(r.target_set, r.label, *old)
                except KeyError:
                    pass
            self._speedup_shown[key] = qs
            SPEEDUP.labels(r.target_set, r.label, *qs).set(ratio)

    def forget(self, keys: set[str]) -> None:
        for key in keys:
            self.detectors.pop(key, None)
            self.last_ts.pop(key, None)
        self._speedup_shown = {k: v for k, v in self._speedup_shown.items() if k[0] not in keys}
        for gauge in (THROUGHPUT, BASELINE, RATIO, DEAD, SPEEDUP):
            drop_children(gauge, "target_set", keys)

    def books(self) -> Iterable[FindingBook]:
        return [d.book for d in self.detectors.values()]

    def state_of(self, key: str) -> dict[str, Any] | None:
        det = self.detectors.get(key)
        if det is None:
            return None
        return {"detector": det.to_dict(), "last_ts": dict(self.last_ts.get(key, {}))}

    def reset(self) -> None:
        self.detectors = {}
        self.last_ts = {}

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        was = NetperfDetector.from_dict(get(state, "detector", ""))   # every field checked
        was.book.check_about({"target_set": key}, "detector.book")
        was.book.refresh_s = self.refresh_s
        # the knobs configured now, not the stored ones: before, a drop_ratio raised by the operator (say, to
        # stop a flapping finding) never applied to a target set already measured; the learned results are kept
        det = self._new_detector()
        det.history = {k: v[-det.baseline_runs:] for k, v in was.history.items()}
        det.by_queues, det.book = was.by_queues, was.book
        stored = {s: event_time(v, f"last_ts[{s!r}]") for s, v in obj(state.get("last_ts", {}), "last_ts").items()}
        self.detectors[key] = det
        self.last_ts[key] = {s: t for s, v in stored.items()
                             if (t := self.trusted_time(v, f"last result of {s}")) is not None}
