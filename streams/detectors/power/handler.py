"""Power agent: ``telemetry.ipmi`` -> energy, cost per usable TB-year, generation deviation, idle servers.

Feeds ``opsloop.streams.detectors.power.detector.PowerDetector``. A server's inventory entry (generation, raw TB,
protection, fill ratio) comes from ``streams.detectors.power.hosts`` or else from the
collector's metadata tags (``generation``, ``raw_capacity_tb``) with the configured defaults
(``replica:3``, 70 % fill: the published cost table's assumptions). State key: the host, written to the partition
its readings come from: its generation's when they carry the ``generation`` tag (``opsloop.topics``
``TOPIC_KEY_TAGS``: a generation compared whole by one worker), else its own. The config's generation names the
host's generation here; the record's tag routes it: keep them equal.

Gauges, per host (labels host, generation), so the published cost table is a Grafana panel:
``opsloop_power_watts`` (smoothed draw), ``opsloop_power_energy_per_year_joules``, ``opsloop_power_eur_per_year``,
``opsloop_power_eur_per_usable_byte_year{..., protection}``; per generation
``opsloop_power_generation_median_watts``.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping, Sequence

from prometheus_client import Gauge

from opsloop.records import Metric
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler, drop_children
from opsloop.streams.detectors.power.settings import PowerSettings
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.state_check import event_time
from opsloop.streams.detectors.power.detector import (POWER_METRICS, PowerDetector, ServerSpec, power_reading,
                                                      spec_from_tags)
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE, child, label_value

HOST = ["host", "generation"]
JOULES_PER_KWH = 3.6e6   # the detector reasons in kWh (prices are per kWh); Prometheus gets joules
BYTES_PER_TB = 1e12      # disks are sold in decimal TB; Prometheus gets bytes
WATTS = Gauge("opsloop_power_watts", "Smoothed power draw of the server (W)", HOST)
ENERGY = Gauge("opsloop_power_energy_per_year_joules", "Energy one year at the current draw takes", HOST)
EUR = Gauge("opsloop_power_eur_per_year", "Power cost per year at the current draw (EUR)", HOST)
EUR_TB = Gauge("opsloop_power_eur_per_usable_byte_year", "Power cost per usable byte and year (EUR)",
               HOST + ["protection"])
GEN_MEDIAN = Gauge("opsloop_power_generation_median_watts", "Median smoothed draw of a server generation (W)",
                   ["generation"])


def _watts(unit: str) -> bool:
    """``unit.lower() == "watts"`` without a new string for every other unit."""
    return unit == "watts" or (len(unit) == 5 and unit.lower() == "watts")


class PowerHandler(DetectorHandler):
    name = "power-detector"
    topics = (Topic.IPMI,)
    names = POWER_METRICS
    # power_reading's first test of an SDR sensor: most of a server's sensors are not its power
    name_filters = {"ipmi_sensor": lambda m: _watts(m.tags.get("unit", ""))}

    def __init__(self, settings: PowerSettings | None = None, refresh_s: float = 300.0) -> None:
        super().__init__()
        self.settings = settings or PowerSettings()
        self.refresh_s = refresh_s
        self.detector = self._new_detector()
        self.last_ts: dict[str, float] = {}
        # (host, generation tag, raw_capacity_tb tag) -> spec_for's answer: the only tags it reads, and
        # they repeat every round (ServerSpec is frozen, so sharing one is safe)
        self._specs: dict[tuple[str, str | None, str | None], ServerSpec | None] = {}

    def _new_detector(self) -> PowerDetector:
        s = self.settings
        det = PowerDetector([], eur_per_kwh=s.eur_per_kwh, deviation_ratio=s.deviation_ratio,
                            min_generation_size=s.min_generation_size, min_samples=s.min_samples,
                            book=FindingBook(self.refresh_s))
        return det

    def spec_for(self, host: str, tags: Mapping[str, str]) -> ServerSpec | None:
        d = self.settings.defaults
        conf = self.settings.hosts.get(host)
        merged = dict(tags)
        if conf is not None:
            if conf.generation:
                merged["generation"] = conf.generation
            if conf.raw_tb:
                merged["raw_capacity_tb"] = str(conf.raw_tb)
        spec = spec_from_tags(host, merged, conf.protection if conf and conf.protection else d.protection,
                              conf.fill_ratio if conf and conf.fill_ratio else d.fill_ratio)
        if spec is not None and conf is not None and conf.in_service is not None:
            spec = ServerSpec(spec.host, spec.generation, spec.raw_tb, spec.protection, spec.fill_ratio,
                              conf.in_service)
        return spec

    def _spec(self, host: str, tags: Mapping[str, str]) -> ServerSpec | None:
        if len(tags.get("generation", "")) > MAX_LABEL_VALUE:   # the generation label of the gauges
            tags = {**tags, "generation": label_value(self.name, "generation", tags["generation"])}
        key = (host, tags.get("generation"), tags.get("raw_capacity_tb"))
        try:
            return self._specs[key]
        except KeyError:
            if len(self._specs) >= 2 * self._seen.cap:   # bounded like the state it describes
                self._specs.clear()
            spec = self._specs[key] = self.spec_for(host, tags)
            return spec

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        det = self.detector
        generations: dict[str, float] = {}   # generation -> newest event time in this batch
        shown: dict[str, None] = {}   # hosts read in this batch, in order: gauges once each, after the loop
        for m in metrics:
            if m.name not in POWER_METRICS:
                continue
            if m.name == "ipmi_sensor" and not _watts(m.tags.get("unit", "")):
                continue   # power_reading's first test, inline: most of a server's sensors are not power
            try:
                reading = power_reading(m)
            except ValueError as e:
                self.reject("power_sample_rejected", m, str(e))
                continue
            if reading is None:
                continue
            host, watts = reading
            if len(host) > MAX_LABEL_VALUE:   # a label value: bounded before it keys any state
                host = label_value(self.name, "host", host)
            if self.is_replay(m.timestamp, self.last_ts.get(host)):
                continue   # replayed after a crash: already counted
            try:
                spec = self._spec(host, m.tags)
            except ValueError as e:   # a tag no restore would take back: refused before it reaches the state
                self.reject("power_sample_rejected", m, str(e))
                continue
            self.last_ts[host] = m.timestamp
            old = det.inventory.get(host)
            if spec is not None and old is not spec and old != spec:
                if old is not None and (old.generation, old.protection) != (spec.generation, spec.protection):
                    self._hide_hosts({host})   # its gauges carry the old labels
                det.set_spec(spec, m.timestamp)   # its findings about the old generation cleared
            # The generation comparison once per generation and batch, below, not per sample.
            det.update({"host": host, "watts": watts, "timestamp": m.timestamp}, deviation=False)
            self.touch(host)
            shown[host] = None
            if host in det.inventory:
                g = det.inventory[host].generation
                generations[g] = max(generations.get(g, m.timestamp), m.timestamp)
        for host in shown:   # the state after the batch: what showing after each reading ended with
            self._show_host(host)
        # Each comparison at its generation's newest reading, not this batch's: its findings are about every
        # host of it, and a batch of a partition lagging behind another stamped them back in time (re-opened
        # before its clear: the paging actuator drops such a record as older than the clear). One pass.
        newest = dict(generations)
        for h, s in det.inventory.items():
            if s.generation in newest and (t := self.last_ts.get(h)) is not None and t > newest[s.generation]:
                newest[s.generation] = t
        for g in generations:
            det.deviation(g, newest[g])
            self._show_generation(g)

    def forget(self, keys: set[str]) -> None:
        generations = {spec.generation for k in keys if (spec := self.detector.inventory.get(k)) is not None}
        for key in keys:
            self.detector.forget(key)
            self.last_ts.pop(key, None)
        self._hide_hosts(keys)
        for g in generations:
            self._show_generation(g)

    @staticmethod
    def _hide_hosts(hosts: set[str]) -> None:
        for gauge in (WATTS, ENERGY, EUR, EUR_TB):
            drop_children(gauge, "host", hosts)

    def _show_host(self, host: str) -> None:
        det = self.detector
        w = det.mean_watts(host)
        if w is None:
            return
        spec = det.inventory.get(host)
        generation = spec.generation if spec else ""
        child(WATTS, host, generation).set(w)
        if spec is None:
            return
        row = det.cost_row(spec, w)
        child(ENERGY, host, generation).set(row["kwh_per_year"] * JOULES_PER_KWH)
        child(EUR, host, generation).set(row["eur_per_year"])
        child(EUR_TB, host, generation, spec.protection).set(row["eur_per_usable_tb_year"] / BYTES_PER_TB)

    def _show_generation(self, generation: str) -> None:
        det = self.detector
        means = [w for h, s in det.inventory.items() if s.generation == generation
                 and (w := det.mean_watts(h)) is not None]
        if means:
            GEN_MEDIAN.labels(generation).set(statistics.median(means))
        else:
            drop_children(GEN_MEDIAN, "generation", {generation})

    def books(self) -> Iterable[FindingBook]:
        return (self.detector.book,)

    def state_of(self, key: str) -> dict[str, Any] | None:
        state = self.detector.state_of(key)
        if state is not None:
            state["last_ts"] = self.last_ts.get(key)
        return state

    def reset(self) -> None:
        self.detector = self._new_detector()
        self.last_ts = {}

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        stored = state.get("last_ts")
        last = None if stored is None else event_time(stored, "last_ts")   # checked before anything is taken
        self.detector.restore_part(key, state)
        if last is not None and (last := self.trusted_time(last, f"last reading of {key}")) is not None:
            self.last_ts[key] = last

    def after_restore(self) -> None:
        for host in self.detector.sums:
            self._show_host(host)
        for g in {s.generation for s in self.detector.inventory.values()}:
            self._show_generation(g)
