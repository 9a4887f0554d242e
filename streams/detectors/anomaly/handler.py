"""Generic anomaly agent: one ``StreamingDetector`` per configured numeric series.

A series is a metric name, a numeric field and the full tag set of the sample (so
``ipmi_power{host=a}.watts`` and ``ipmi_power{host=b}.watts`` are two series). Which metrics and
fields are watched is configuration (``streams.detectors.anomaly.series``); the agent
subscribes to the topics those metrics travel on.

Per series the state is the detector's ``to_dict()`` plus the series' finding book and the event
time of its last point: a restarted worker continues scoring at once (no second warm-up), and a
replayed point (at-least-once delivery after a crash) is skipped instead of being learned twice.

Finding ``anomaly.<metric>.<field>`` (warning) when a point scores at least ``open_score``. The
detector scores one event once, so the finding stays open while the detector reports the series out
of its band (``in_event``) and is cleared after ``clear_after`` consecutive points back in band and
below ``clear_score``. Gauges ``opsloop_anomaly_score``, ``opsloop_anomaly_expected``,
``opsloop_anomaly_lower`` and ``opsloop_anomaly_upper`` {metric, field, series} show the band.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from prometheus_client import Counter, Gauge

from opsloop.records import Finding, Severity
from opsloop.labels import label_string
from opsloop.records import Metric
from opsloop.topics import topic_for
from opsloop.streams.agents.base import DetectorHandler, log, number
from opsloop.streams.detectors.anomaly.settings import AnomalySettings, SeriesSpec
from opsloop.streams.detectors.anomaly.model import MAX_ABS_VALUE, DetectorConfig, StreamingDetector
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.state_check import count, event_time, get, text, texts
from opsloop.streams.runtime.gauges import bounded_tags, child, label_value

LABELS = ["metric", "field", "series"]
SCORE = Gauge("opsloop_anomaly_score", "Anomaly score in [0, 1] of the series' last point", LABELS)
EXPECTED = Gauge("opsloop_anomaly_expected", "Expected value of the series' last point", LABELS)
LOWER = Gauge("opsloop_anomaly_lower", "Lower edge of the normal band at the last point", LABELS)
UPPER = Gauge("opsloop_anomaly_upper", "Upper edge of the normal band at the last point", LABELS)
OBSERVED = Gauge("opsloop_anomaly_observed", "Observed value of the series' last point (drawn in its band)", LABELS)
DROPPED = Counter("opsloop_anomaly_series_dropped_total", "Samples of new series ignored (max_series reached)",
                  ["metric"])


def series_label(tags: Mapping[str, str]) -> str:
    """The tag set as ``k=v,...`` with separators in keys or values escaped (:func:`opsloop.labels.label_string`):
    ``{"host": "a,rack=1"}`` and ``{"host": "a", "rack": "1"}`` are two series, not one state key.
    Without separators it is the plain join, so keys written before stay the same."""
    return label_string(tags)


@dataclass(slots=True)
class Series:
    spec_metric: str
    spec_field: str
    tags: dict[str, str]
    detector: StreamingDetector
    book: FindingBook
    last_ts: float | None = None
    calm: int = 0                                   # consecutive points below clear_score
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> dict[str, str]:
        return {**self.tags, "metric": self.spec_metric, "field": self.spec_field}

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.spec_metric, "field": self.spec_field, "tags": self.tags,
                "detector": self.detector.to_dict(), "book": self.book.to_dict(), "last_ts": self.last_ts,
                "calm": self.calm}


class AnomalyHandler(DetectorHandler):
    name = "anomaly-detector"

    def __init__(self, settings: AnomalySettings | None = None, refresh_s: float = 300.0) -> None:
        super().__init__()
        self.settings = settings or AnomalySettings()
        self.refresh_s = refresh_s
        self.config = DetectorConfig(**self.settings.detector)  # type: ignore[arg-type]
        self._config_doc = asdict(self.config)
        self._restored_changed: set[str] = set()   # knobs a restored series had other values of
        self.specs: dict[str, list[SeriesSpec]] = {}
        for spec in self.settings.series:
            self.specs.setdefault(spec.metric, []).append(spec)
        self.topics = tuple(sorted({topic_for(s.metric, {}) for s in self.settings.series}, key=str))
        self.names = frozenset(self.specs)
        self.series: dict[str, Series] = {}
        self._scored: list[str] = []   # series scored by the last process() call
        self._keys: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}

    @staticmethod
    def key(metric: str, field_name: str, tags: Mapping[str, str]) -> str:
        return f"{metric}.{field_name}|{series_label(tags)}"

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        scored: dict[str, float] = {}
        for m in metrics:
            for spec in self.specs.get(m.name, ()):
                if spec.tags and any(m.tags.get(k) != v for k, v in spec.tags.items()):
                    continue
                value = number(m.fields, spec.field)
                if value is None:
                    continue
                if abs(value) > MAX_ABS_VALUE:   # the detector refuses it: a corrupt sample
                    self.reject("anomaly_sample_rejected", m,
                                f"{spec.field}: value {value!r}: beyond ±{MAX_ABS_VALUE:g}",
                                metric=m.name, field=spec.field)
                    continue
                key = self._key_of(spec, m.tags)
                score = self._point(key, spec, m, value)
                if score is not None:
                    scored[key] = score
        # Gauges once per series and batch (the last point), not per point: the hot loop stays lean.
        for key, score in scored.items():
            self._show(self.series[key], score)
        self._touched.update(scored)
        self._scored = list(scored)

    def _key_of(self, spec: SeriesSpec, tags: Mapping[str, str]) -> str:
        ck = (spec.metric, spec.field, tuple(tags.items()))
        key = self._keys.get(ck)
        if key is None:
            # the series' tag set, bounded: it keys the state, its table entry and the finding's where
            # (a 1 MB tag made a state key and changelog record beyond Kafka's message size)
            given = dict(tags)
            bounded = bounded_tags(self.name, given)
            key = self.key(spec.metric, spec.field, bounded)
            if bounded is given:   # a tag set cut short is not cached: the cache would keep its long values
                if len(self._keys) > 4 * self.settings.max_series:
                    self._keys.clear()
                self._keys[ck] = key
        return key

    def _point(self, key: str, spec: SeriesSpec, m: Metric, value: float) -> float | None:
        s = self.series.get(key)
        if s is None:
            if len(self.series) >= self.settings.max_series:
                DROPPED.labels(spec.metric).inc()
                return None
            s = Series(spec.metric, spec.field, bounded_tags(self.name, dict(m.tags)), StreamingDetector(self.config),
                       FindingBook(self.refresh_s))
            self.series[key] = s
        if s.last_ts is not None and m.timestamp <= s.last_ts:
            return None   # a replayed or out-of-order point: already learned
        s.last_ts = m.timestamp
        score = s.detector.update(m.timestamp, value)
        if score >= self.settings.clear_score or s.book.open:
            self._finding(s, score, m.timestamp)
        return score

    def _finding(self, s: Series, score: float, now: float) -> None:
        cfg = self.settings
        detector = f"anomaly.{s.spec_metric}.{s.spec_field}"
        is_open = s.book.is_open(detector, s.where)
        # The detector scores an event once; the finding stays open while the detector says the
        # series is still out of its band (or the score is still above clear_score).
        if score >= cfg.open_score or (is_open and (score >= cfg.clear_score or s.detector.in_event)):
            s.calm = 0
            if is_open and score < cfg.open_score:
                return   # still unusual, not enough to refresh the observation
            e = s.detector.explain()
            s.book.raise_(
                detector=detector, what=f"{s.spec_metric}.{s.spec_field} outside its normal band", where=s.where,
                observed=round(e["observed"], 6), expected=round(e["expected"], 6), score=score,
                severity=Severity.WARNING,
                explanation=f"{s.spec_metric}.{s.spec_field} {{{series_label(s.tags)}}}: {s.detector.describe()}",
                now=now)
        elif is_open:
            s.calm += 1
            if s.calm >= cfg.clear_after:
                s.book.clear(detector, s.where, now, f"back in its band for {s.calm} points: "
                                                       f"{s.detector.describe()}")
                s.calm = 0

    def _show(self, s: Series, score: float) -> None:
        # the tag set as one label value: bounded (64 tags of any length fit a sample)
        labels = (s.spec_metric, s.spec_field, label_value(self.name, "series", series_label(s.tags)))
        e = s.detector.explain()
        child(SCORE, *labels).set(score)
        child(OBSERVED, *labels).set(e["observed"])
        if e["warm"]:
            child(EXPECTED, *labels).set(e["expected"])
            child(LOWER, *labels).set(e["lower"])
            child(UPPER, *labels).set(e["upper"])

    def books(self) -> Iterable[FindingBook]:
        return [s.book for s in self.series.values()]

    def changed_books(self) -> Iterable[FindingBook]:
        # only a scored point changes its series' book (_point -> _finding)
        return [s.book for k in self._scored if (s := self.series.get(k)) is not None]

    def key_of_finding(self, finding: Finding) -> str | None:
        where = dict(finding.where)
        metric, field_name = where.pop("metric", ""), where.pop("field", "")
        return self.key(metric, field_name, where)

    def state_of(self, key: str) -> dict[str, Any] | None:
        s = self.series.get(key)
        return s.to_dict() if s else None

    def reset(self) -> None:
        self.series = {}

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        # every field checked before the series is taken (StateError naming it)
        last_ts = state.get("last_ts")
        last = None if last_ts is None else event_time(last_ts, "last_ts")
        # the knobs configured now, not the stored ones: a changed setting applies to the series restored
        stored = get(state, "detector", "")
        s = Series(text(get(state, "metric", ""), "metric"), text(get(state, "field", ""), "field"),
                   texts(get(state, "tags", ""), "tags"), StreamingDetector.from_dict(stored, config=self.config),
                   FindingBook.from_dict(state.get("book", {}), self.refresh_s),
                   None, count(state.get("calm", 0), "calm"))
        s.book.check_about(s.where)   # its one finding is about the series (else never cleared: not is_open)
        # the replay guard as the other handlers restore theirs: one beyond the skew would skip every point
        s.last_ts = None if last is None else self.trusted_time(last, f"last point of {key}")
        self.series[key] = s
        was = stored.get("config")   # (not used: only told)
        if isinstance(was, dict):
            self._restored_changed.update(k for k, v in was.items() if self._config_doc.get(k, v) != v)

    def after_restore(self) -> None:
        log.info("anomaly_series_restored", series=len(self.series),
                 warm=sum(1 for s in self.series.values() if s.detector.explain()["warm"]),
                 settings_changed=sorted(self._restored_changed))   # stored under other values; now configured
        self._restored_changed = set()
