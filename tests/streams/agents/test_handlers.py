"""Detector handlers without Kafka: the collectors' real metric shapes in, findings/outbox/gauges/state out."""

from __future__ import annotations

import logging
import random
from typing import Callable

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.records import Severity
from opsloop.records import Metric, metric
from opsloop.records.finding import MAX_WHERE_VALUE
from opsloop.records.metric import MAX_NAME_LEN
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.agents.settings import DetectorsSettings, detectors_settings
from opsloop.streams.detectors.anomaly.settings import AnomalySettings
from opsloop.streams.detectors.keystone.settings import KeystoneSettings
from opsloop.streams.detectors.power.settings import PowerSettings

T0 = 1_790_000_000.0


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def restarted(h: DetectorHandler, keys: set[str] | None = None) -> DetectorHandler:
    """A fresh handler of the same kind restored from the JSON state of ``h`` (what a restart sees)."""
    keys = keys if keys is not None else set(handler_keys(h))
    states = {k: orjson.loads(orjson.dumps(h.state_of(k))) for k in keys if h.state_of(k) is not None}
    fresh = type(h)(h.settings, h.refresh_s)  # type: ignore[attr-defined]
    fresh.restore(states)
    return fresh


def handler_keys(h: DetectorHandler) -> list[str]:
    for attr in ("series", "hosts", "detectors"):
        if isinstance(getattr(h, attr, None), dict):
            return list(getattr(h, attr))
    if isinstance(h, FirewallHandler):
        return list(h.detector.latest)
    if isinstance(h, PowerHandler):
        return list(h.detector.sums)
    raise AssertionError(type(h))


def events(h: DetectorHandler) -> list[tuple[str, str, dict[str, str]]]:
    return [(e, f.detector, f.where) for e, f in h.drain_outbox()]


# ------------------------------------------------------------------------------------------ firewall
def iptables_round(hv: str, ts: float, ports: dict[str, bool], base_fp: str = "base-a",
                   neutron: str = "2:9.4.1", host_level: bool = True) -> list[Metric]:
    out = [metric("iptables_vm_port", {"protected": int(ok), **({} if ok else {"reason": "no ingress chain"})},
                  {"host": hv, "port_id": p, "device": f"tap{p}", "vm": f"vm-{p}"}, ts) for p, ok in ports.items()]
    if host_level:
        out.append(metric("iptables_ruleset", {"fingerprint": f"fp-{hv}", "base_fingerprint": base_fp,
                                               "ports_expected": len(ports)}, {"host": hv}, ts))
        out.append(metric("iptables_software", {"version": neutron}, {"host": hv, "package": "neutron-common"}, ts))
    return out


def test_firewall_unprotected_port_opens_once_across_restart_and_clears() -> None:
    h = FirewallHandler()
    h.handle(iptables_round("hv-a", T0, {"p1": False, "p2": True}), T0)
    assert events(h) == [("opened", "firewall.unprotected_port", {"hypervisor": "hv-a", "port": "p1", "vm": "vm-p1"})]
    assert h.touched() == {"hv-a"}
    assert gauge("opsloop_firewall_ports", hypervisor="hv-a", role="default", state="unprotected") == 1.0
    assert gauge("opsloop_firewall_ports", hypervisor="hv-a", role="default", state="protected") == 1.0
    [f] = h.open_findings()
    assert f.severity is Severity.CRITICAL and "no ingress chain" in f.explanation
    assert f.runbook.startswith("https://") and f.runbook.endswith("/firewall.md#firewall-unprotected-port")

    h2 = restarted(h)
    h2.handle(iptables_round("hv-a", T0 + 60, {"p1": False, "p2": True}), T0 + 60)
    assert events(h2) == []                                # still open: nothing new to publish
    assert h2.open_findings()[0].first_seen == T0
    h2.handle(iptables_round("hv-a", T0 + 400, {"p1": False, "p2": True}), T0 + 400)
    assert [e for e, _, _ in events(h2)] == ["refreshed"]  # heartbeat after refresh_s of event time
    h2.handle(iptables_round("hv-a", T0 + 30, {"p1": True, "p2": True}), T0 + 30)
    assert events(h2) == [] and h2.open_findings()          # an older round replayed: ignored
    h2.handle(iptables_round("hv-a", T0 + 500, {"p1": True, "p2": True}), T0 + 500)
    [(event, finding)] = h2.drain_outbox()
    assert event == "cleared" and finding.cleared and finding.first_seen == T0
    assert gauge("opsloop_firewall_ports", hypervisor="hv-a", role="default", state="unprotected") == 0.0


def test_firewall_partial_round_does_not_clear_vanished_ports() -> None:
    h = FirewallHandler()
    h.handle(iptables_round("hv-b", T0, {"p1": False}), T0)
    h.drain_outbox()
    # Port samples of another port only, no host-level sample: p1 may still be there.
    h.handle(iptables_round("hv-b", T0 + 60, {"p9": True}, host_level=False), T0 + 60)
    assert events(h) == []
    h.handle(iptables_round("hv-b", T0 + 120, {"p9": True}), T0 + 120)   # a complete round without p1
    assert events(h) == [("cleared", "firewall.unprotected_port", {"hypervisor": "hv-b", "port": "p1", "vm": "vm-p1"})]


def test_firewall_drift_by_role_from_config_and_tags() -> None:
    conf = DetectorsSettings.model_validate({"firewall": {"roles": {"c1": "compute", "c2": "compute",
                                                                    "c3": "compute", "c4": "compute"}}}).firewall
    h = FirewallHandler(conf)
    batch: list[Metric] = []
    for i, hv in enumerate(("c1", "c2", "c3", "c4")):
        batch += iptables_round(hv, T0, {f"{hv}-p": True}, base_fp="base-b" if hv == "c3" else "base-a",
                                neutron="2:9.0.0" if hv == "c4" else "2:9.4.1")
    h.handle(batch, T0)
    got = sorted((d, w["hypervisor"]) for e, d, w in events(h))
    assert got == [("firewall.package_drift", "c4"), ("firewall.ruleset_drift", "c3")]
    assert gauge("opsloop_firewall_drift", hypervisor="c3", role="compute", kind="ruleset") == 1.0
    assert gauge("opsloop_firewall_drift", hypervisor="c1", role="compute", kind="ruleset") == 0.0
    # Per-hypervisor state parts: the drift finding of c3 lives in c3's state, restored with it.
    h2 = restarted(h)
    assert {f.where["hypervisor"] for f in h2.open_findings()} == {"c3", "c4"}
    h2.handle(iptables_round("c3", T0 + 60, {"c3-p": True}, base_fp="base-a"), T0 + 60)
    assert ("cleared", "firewall.ruleset_drift") in [(e, d) for e, d, _ in events(h2)]
    assert "c3" in h2.touched()


# --------------------------------------------------------------------------------------------- power
PUBLISHED_GENERATIONS = {"gen1": (248.0, 48), "gen2": (205.0, 48), "gen3": (155.0, 96)}
PUBLISHED_COST = {"gen1": 29.10, "gen2": 24.05, "gen3": 9.09}


def power_samples(host: str, generation: str, watts: float, raw_tb: float, t0: float, n: int) -> list[Metric]:
    tags = {"host": host, "source": "dcmi", "generation": generation, "raw_capacity_tb": f"{raw_tb:g}"}
    return [metric("ipmi_power", {"watts": watts, "watts_avg": watts}, tags, t0 + 30 * i) for i in range(n)]


def test_published_power_table_as_gauges_from_collector_tags() -> None:
    h = PowerHandler()
    batch = [m for g, (w, tb) in PUBLISHED_GENERATIONS.items() for m in power_samples(f"pub-{g}", g, w, tb, T0, 4)]
    h.handle(batch, T0)
    for g, cost in PUBLISHED_COST.items():
        got = 1e12 * gauge("opsloop_power_eur_per_usable_byte_year", host=f"pub-{g}", generation=g,
                           protection="replica:3")   # per byte exported, per TB in the reference table
        assert got == pytest.approx(cost, abs=0.01)
        assert gauge("opsloop_power_watts", host=f"pub-{g}", generation=g) == pytest.approx(PUBLISHED_GENERATIONS[g][0])
    assert gauge("opsloop_power_energy_per_year_joules", host="pub-gen3", generation="gen3") == pytest.approx(155 * 8.76 * 3.6e6)
    cost = [f for e, f in h.drain_outbox() if f.detector == "power.cost"]
    assert {f.where["host"]: f.observed for f in cost} == {f"pub-{g}": c for g, c in PUBLISHED_COST.items()}


def test_power_config_overrides_tags_erasure_coding_halves_the_cost() -> None:
    conf = PowerSettings.model_validate({"hosts": {"ec-gen3": {"protection": "ec:2+1"}}})
    h = PowerHandler(conf)
    h.handle(power_samples("ec-gen3", "gen3", 155.0, 96, T0, 3), T0)
    got = 1e12 * gauge("opsloop_power_eur_per_usable_byte_year", host="ec-gen3", generation="gen3", protection="ec:2+1")
    assert got == pytest.approx(9.09 / 2, abs=0.01)


def test_power_generation_deviation_and_replay_guard() -> None:
    h = PowerHandler()
    batch: list[Metric] = []
    for i, w in enumerate((205.0, 204.0, 206.0, 290.0)):
        batch += power_samples(f"dev-g2-{i}", "gen2x", w, 48, T0, 4)
    h.handle(batch, T0)
    dev = [f for e, f in h.drain_outbox() if f.detector == "power.generation_deviation" and e == "opened"]
    assert [f.where["host"] for f in dev] == ["dev-g2-3"] and dev[0].expected == pytest.approx(205.0, abs=1)
    assert gauge("opsloop_power_generation_median_watts", generation="gen2x") == pytest.approx(205.5)
    before = h.detector.sums["dev-g2-0"][1]
    h.handle(power_samples("dev-g2-0", "gen2x", 999.0, 48, T0, 2), T0)     # replayed timestamps
    assert h.detector.sums["dev-g2-0"][1] == before
    h2 = restarted(h)
    assert h2.detector.sums["dev-g2-0"] == h.detector.sums["dev-g2-0"]
    assert h2.detector.inventory["dev-g2-3"].generation == "gen2x"


def test_power_from_telegraf_sdr_sensors_takes_the_total_not_the_psus() -> None:
    h = PowerHandler()
    batch = []
    for i in range(3):
        for name, watts in (("pwr_consumption", 136.0), ("ps1_input_power", 70.0), ("ps2_input_power", 66.0)):
            batch.append(metric("ipmi_sensor", {"value": watts, "status": 1},
                                {"host": "tg-gen3", "name": name, "unit": "watts", "server": "10.0.0.3"}, T0 + 60 * i))
    h.handle(batch, T0)
    assert h.detector.sums["tg-gen3"] == [136.0, 3]
    assert gauge("opsloop_power_watts", host="tg-gen3", generation="") == 136.0


def test_power_bad_sample_is_counted_not_raised() -> None:
    h = PowerHandler()
    h.handle([metric("ipmi_power", {"watts": "n/a"}, {"host": "x"}, T0),
              metric("ipmi_power", {"watts": -3.0}, {"host": "y"}, T0)], T0)
    assert h.rejected == 2 and not h.detector.sums


def test_unreadable_samples_are_counted_per_detector_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A poison stream of unreadable samples (a string where watts go) is counted in the detector's
    Prometheus counter, every sample, but logged once a minute: the line after the quiet minute says
    how many went unlogged. The good sample in the same batch is still read."""
    clock = [1000.0]
    monkeypatch.setattr("opsloop.streams.agents.base.time.monotonic", lambda: clock[0])
    caplog.set_level(logging.WARNING, logger="opsloop")
    before = REGISTRY.get_sample_value("opsloop_detector_samples_rejected_total", {"detector": "power-detector"}) or 0.0
    h = PowerHandler()
    bad = [metric("ipmi_power", {"watts": "n/a"}, {"host": f"x{i}"}, T0) for i in range(500)]
    h.handle(bad + [metric("ipmi_power", {"watts": 136.0}, {"host": "ok"}, T0)], T0)
    clock[0] += 61.0
    h.handle([metric("ipmi_power", {"watts": -1.0}, {"host": "y"}, T0 + 60)], T0 + 60)
    after = REGISTRY.get_sample_value("opsloop_detector_samples_rejected_total", {"detector": "power-detector"})
    assert h.rejected == 501 and after - before == 501
    assert "ok" in h.detector.sums
    lines = [r for r in caplog.records if getattr(r, "event", "") == "power_sample_rejected"]
    assert [r.fields.get("unlogged_since") for r in lines] == [None, 499]
    assert "watts" in lines[0].fields["error"]


# ------------------------------------------------------------------------------------------- netperf
def netperf_set(queues: int, gbps: float, ts: float, kernel: str, failed: int = 0) -> Metric:
    return metric("netperf_throughput", {"mean_gbps": gbps, "min_gbps": gbps * 0.95, "runs": 10,
                                         "failed_targets": failed, "failed": ""},
                  {"host": "bench-1", "target_set": "six-vms", "driver": "netperf", "test": "TCP_STREAM",
                   "queues": str(queues), "kernel": kernel}, ts)


def test_published_queue_scaling_and_regression_from_collector_samples() -> None:
    h = NetperfHandler()
    old = {1: 3.28, 2: 3.41, 4: 3.51, 8: 3.57}
    new = {1: 3.23, 2: 6.00, 4: 8.02, 8: 8.42}
    h.handle([netperf_set(q, g, T0, "4.2") for q, g in old.items()] +
             [netperf_set(q, g, T0, "4.4") for q, g in new.items()], T0)
    scaling = [(e, f) for e, f in h.drain_outbox() if f.detector == "netperf.no_queue_scaling"]
    assert [(e, f.where["label"]) for e, f in scaling] == [("opened", "driver=netperf,kernel=4.2,test=TCP_STREAM")]
    new_label = "driver=netperf,kernel=4.4,test=TCP_STREAM"
    assert gauge("opsloop_netperf_queue_speedup", target_set="six-vms", label=new_label, queues_low="1",
                 queues_high="8") == pytest.approx(8.42 / 3.23)
    # The regression: 8 queues on the new kernel fall back to ~3.5 Gb/s.
    h.handle([netperf_set(8, 3.5, T0 + 3600, "4.4")], T0 + 3600)
    drop = [(e, f) for e, f in h.drain_outbox() if f.detector == "netperf.throughput_drop"]
    assert len(drop) == 1 and drop[0][0] == "opened" and drop[0][1].expected == pytest.approx(8.42)
    labels = {"target_set": "six-vms", "label": "driver=netperf,kernel=4.4,test=TCP_STREAM", "queues": "8"}
    assert gauge("opsloop_netperf_throughput_ratio", **labels) == pytest.approx(3.5 / 8.42)
    # A round in which a target failed is not a regression of the network.
    h.handle([netperf_set(4, 1.0, T0 + 3600, "4.4", failed=2)], T0 + 3600)
    assert not h.drain_outbox()
    h2 = restarted(h)
    h2.handle([netperf_set(8, 8.4, T0 + 7200, "4.4")], T0 + 7200)
    # Recovered: the drop clears, and so does the "no scaling" the regression had caused on 4.4.
    assert sorted((e, f.detector, f.where["label"]) for e, f in h2.drain_outbox()) == [
        ("cleared", "netperf.no_queue_scaling", "driver=netperf,kernel=4.4,test=TCP_STREAM"),
        ("cleared", "netperf.throughput_drop", "driver=netperf,kernel=4.4,test=TCP_STREAM")]


def test_a_target_set_named_with_a_bar_keeps_its_own_replay_guard() -> None:
    """The replay guard was keyed by the series text, its set read back as the text before the first
    '|': a set named 'a|b' was saved with set 'a' and forgotten with neither, and 'a' took its entries."""
    def result(target_set: str, gbps: float, ts: float) -> Metric:
        m = netperf_set(1, gbps, ts, "4.4")
        return metric(m.name, m.fields, {**m.tags, "target_set": target_set}, ts)

    h = NetperfHandler()
    h.handle([result("a|b", 3.0, T0), result("a", 5.0, T0 + 60)], T0 + 60)
    assert all(h.state_of(k)["last_ts"] for k in ("a|b", "a"))
    assert set(h.state_of("a")["last_ts"].values()) == {T0 + 60}       # not 'a|b''s entry too
    h2 = restarted(h, {"a|b"})
    h2.handle([result("a|b", 3.0, T0)], T0 + 120)                       # a replay of the saved result: skipped
    assert h2.detectors["a|b"].to_dict() == h.detectors["a|b"].to_dict()
    h.forget({"a|b"})
    assert h.state_of("a") is not None and h.state_of("a|b") is None
    assert all(not s.startswith("a|b|") for s in h.state_of("a")["last_ts"])


# ------------------------------------------------------------------------------------------ keystone
def keystone_round(host: str, ts: float, p50: float, credentials: dict[str, int] | None = None,
                   small: tuple[int, float, float] | None = None) -> list[Metric]:
    out = [metric("keystone_probe", {"count": 5.0, "p50_ms": p50, "p95_ms": p50 * 1.2, "max_ms": p50 * 1.5,
                                     "errors": 0.0}, {"host": host, "probe": "token_validate"}, ts)]
    if credentials:
        for key, n in credentials.items():
            fields = {"rank": 1.0, "requests": float(n), "keystone_validations": float(n), "share": 0.1}
            out.append(metric("s3_frontend_credential", fields, {"host": host, "access_key": key}, ts))
    if small:
        n, p50s, p95s = small
        out.append(metric("s3_frontend_requests", {"requests": float(n), "small_requests": float(n),
                                                   "small_p50_ms": p50s, "small_p95_ms": p95s, "keystone_validations":
                                                   float(n)}, {"host": host}, ts))
    return out


def test_keystone_regime_heavy_hitters_and_small_p95() -> None:
    conf = KeystoneSettings(heavy_window_s=120, heavy_pane_s=60, heavy_min_total=50, p95_window_s=60,
                            p95_min_requests=10)
    h = KeystoneHandler(conf)
    creds = {"AKIAHEAVY": 400, "AKIAQUIET": 30, "_other": 900}
    for i in range(10):                             # fast regime, ~9 ms; a heavy client among many
        h.handle(keystone_round("ks1", T0 + 15 * i, 9.0 + (i % 3), creds, (200, 80.0, 100.0)), T0)
    assert gauge("opsloop_keystone_latency_regime_seconds", host="ks1", source="probe:token_validate") < 0.015
    assert gauge("opsloop_keystone_small_request_p95_window_seconds", host="ks1") == pytest.approx(0.100, rel=0.02)
    heavy = [(e, f) for e, f in h.drain_outbox() if f.detector == "keystone.heavy_hitter"]
    assert {f.where["credential"] for _, f in heavy} == {"AKIAHEAVY"}    # never the _other bucket
    share = gauge("opsloop_keystone_credential_share", host="ks1", credential="AKIAHEAVY")
    assert share == pytest.approx(400 / 1330, rel=0.01)
    h = restarted(h)
    for i in range(10, 30):                          # caching off: ~650 ms, p95 of small requests ~750 ms
        h.handle(keystone_round("ks1", T0 + 15 * i, 650.0 + (i % 3), None, (200, 600.0, 750.0)), T0)
    out = h.drain_outbox()
    regime = [f for e, f in out if f.detector == "keystone.latency_regime" and e == "opened"]
    assert regime and regime[0].where == {"host": "ks1", "source": "probe:token_validate"}
    assert regime[0].observed > 300 and regime[0].expected < 15
    p95 = [f for e, f in out if f.detector == "keystone.small_request_p95" and e == "opened"]
    assert p95 and p95[0].observed == pytest.approx(750.0, rel=0.02)
    assert gauge("opsloop_keystone_small_request_p95_seconds", host="ks1") == pytest.approx(0.750)
    # Replayed rounds (same event time) are not counted twice.
    n = h.hosts["ks1"].regimes["probe:token_validate"].n
    h.handle(keystone_round("ks1", T0 + 15 * 29, 650.0), T0)
    assert h.hosts["ks1"].regimes["probe:token_validate"].n == n


# ------------------------------------------------------------------------------------------- anomaly
def test_anomaly_warm_series_scores_right_after_restore_and_clears() -> None:
    conf = AnomalySettings.model_validate({"series": [{"metric": "ipmi_power", "field": "watts"}]})
    h = AnomalyHandler(conf)
    rng = random.Random(3)
    h.handle([metric("ipmi_power", {"watts": 155 + rng.gauss(0, 1)}, {"host": "an1"}, T0 + 60 * i)
              for i in range(40)], T0)
    assert not h.drain_outbox()
    assert h.touched() == {"ipmi_power.watts|host=an1"}
    h2 = restarted(h)
    h2.handle([metric("ipmi_power", {"watts": 400.0}, {"host": "an1"}, T0 + 60 * 40)], T0)
    [(event, f)] = h2.drain_outbox()
    assert event == "opened" and f.detector == "anomaly.ipmi_power.watts" and f.score >= 0.9
    assert f.where == {"host": "an1", "metric": "ipmi_power", "field": "watts"} and f.observed == 400.0
    assert gauge("opsloop_anomaly_score", metric="ipmi_power", field="watts", series="host=an1") >= 0.9
    # A fresh detector (what a lost state would mean) is still warming up: it would score 0.
    fresh = AnomalyHandler(conf)
    fresh.handle([metric("ipmi_power", {"watts": 400.0}, {"host": "an1"}, T0 + 60 * 40)], T0)
    assert not fresh.drain_outbox()
    h2.handle([metric("ipmi_power", {"watts": 155 + rng.gauss(0, 1)}, {"host": "an1"}, T0 + 60 * (41 + i))
               for i in range(conf.clear_after)], T0)
    assert [e for e, _ in h2.drain_outbox()] == ["cleared"]
    # Replayed points are not learned twice; other metrics and fields are ignored.
    n = h2.series["ipmi_power.watts|host=an1"].detector.n
    h2.handle([metric("ipmi_power", {"watts": 155.0}, {"host": "an1"}, T0 + 60 * 41),
               metric("ipmi_power", {"volts": 12.0}, {"host": "an1"}, T0 + 60 * 99),
               metric("ipmi_bmc", {"watts": 1.0}, {"host": "an1"}, T0 + 60 * 99)], T0)
    assert h2.series["ipmi_power.watts|host=an1"].detector.n == n and len(h2.series) == 1


def test_anomaly_max_series_bound_and_settings_errors() -> None:
    h = AnomalyHandler(AnomalySettings.model_validate({"series": [{"metric": "ipmi_power", "field": "watts"}],
                                                       "max_series": 2}))
    h.handle([metric("ipmi_power", {"watts": 1.0}, {"host": f"h{i}"}, T0) for i in range(5)], T0)
    assert len(h.series) == 2
    with pytest.raises(ValueError, match="streams.detectors.anomaly.series.0.metric"):
        detectors_settings(Settings(controllers={"detectors": {"anomaly": {"series": [{"metric": "nope",
                                                                                        "field": "x"}]}}}))
    with pytest.raises(ValueError, match="power.defaults.protection"):
        detectors_settings(Settings(controllers={"detectors": {"power": {"defaults": {"protection": "raid5"}}}}))
    with pytest.raises(ValueError, match="unknown detector setting"):
        detectors_settings(Settings(controllers={"detectors": {"anomaly": {"detector": {"warmup": 3}}}}))


@pytest.mark.parametrize("bad", [{"z_width": 0}, {"flat_p": 1}, {"mean_rate": 0}, {"alpha": -0.1},
                                 {"warmup_points": 2.5}, {"tail_quantile": 0.9}])
def test_anomaly_detector_settings_outside_their_range_are_refused_at_load(bad: dict[str, float]) -> None:
    # before, these loaded, and every sample of every series then raised (divided by zero, log(0)) and was
    # dead-lettered: the detector watched nothing
    name = next(iter(bad))
    with pytest.raises(ValueError, match=rf"streams\.detectors\.anomaly\.detector[\s\S]*detector\.{name}: "):
        detectors_settings(Settings(streams={"detectors": {"anomaly": {"detector": {"z0": 2.0, **bad}}}}))
    ok = detectors_settings(Settings(streams={"detectors": {"anomaly": {"detector": {"z0": 2.0, "z_width": 0.5}}}}))
    AnomalyHandler(ok.anomaly).handle([metric("ipmi_power", {"watts": 150.0}, {"host": "x"}, T0)], T0)


@pytest.mark.parametrize("key, bound", [("metric", MAX_NAME_LEN), ("field", MAX_WHERE_VALUE)])
def test_an_anomaly_series_name_beyond_its_bound_is_refused_at_load(key: str, bound: int) -> None:
    """A series' metric and field are values of its findings' ``where`` (at most MAX_WHERE_VALUE characters): a
    field of 1025 loaded, and every finding of the series then failed to build (its samples dead-lettered); a
    metric is a sample's name besides (at most MAX_NAME_LEN): a longer one loaded and matched no sample."""
    spec = {"metric": "ipmi_power", "field": "watts"}
    with pytest.raises(ValueError, match=rf"streams\.detectors\.anomaly\.series\.0\.{key}: .*at most {bound} char"):
        detectors_settings(Settings(streams={"detectors": {"anomaly": {"series": [
            {**spec, key: spec[key].ljust(bound + 1, "x")}]}}}))
    # at the bound: loads, and the series' finding is built
    longest = {**spec, key: spec[key].ljust(bound, "x")}
    h = AnomalyHandler(detectors_settings(Settings(streams={"detectors": {"anomaly": {"series": [longest]}}})).anomaly)
    rng = random.Random(3)
    h.handle([metric(longest["metric"], {longest["field"]: 155 + rng.gauss(0, 1)}, {"host": "an1"}, T0 + 60 * i)
              for i in range(40)], T0)
    h.handle([metric(longest["metric"], {longest["field"]: 400.0}, {"host": "an1"}, T0 + 60 * 40)], T0)
    [(event, f)] = h.drain_outbox()
    assert event == "opened" and f.where[key] == longest[key]


def test_restore_of_a_corrupt_key_starts_that_key_afresh() -> None:
    h = AnomalyHandler()
    h.restore({"ipmi_power.watts|host=x": {"metric": "ipmi_power"}, "bad": {"detector": {"version": 99}}})
    assert h.series == {}
    h.handle([metric("ipmi_power", {"watts": 150.0}, {"host": "x"}, T0)], T0)   # that key starts afresh
    assert h.series["ipmi_power.watts|host=x"].detector.n == 1


def test_a_setting_changed_between_two_runs_applies_to_the_series_restored(caplog: pytest.LogCaptureFixture) -> None:
    # before, the stored knobs won: an operator who raised z0 saw no change on any series already watched
    spec = {"series": [{"metric": "ipmi_power", "field": "watts"}]}
    first = AnomalyHandler(AnomalySettings.model_validate(spec))
    for i in range(60):
        first.handle([metric("ipmi_power", {"watts": 150.0 + (i % 3)}, {"host": "x"}, T0 + 60 * i)], T0)
    (key,) = first.series
    state = orjson.loads(orjson.dumps(first.state_of(key)))
    second = AnomalyHandler(AnomalySettings.model_validate({**spec, "detector": {"z0": 50.0, "z_width": 4.0}}))
    with caplog.at_level(logging.INFO, logger="opsloop"):
        second.restore({key: state})
    det = second.series[key].detector
    assert (det.cfg.z0, det.cfg.z_width) == (50.0, 4.0) and det.n == 60, "the learned state is kept, the knobs new"
    restored = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "anomaly_series_restored"]
    assert restored[-1]["settings_changed"] == ["z0", "z_width"]
    # a stored config the handler no longer uses is not read: damage there costs the series nothing
    state["detector"]["config"] = {"z0": "bogus"}
    third = AnomalyHandler(AnomalySettings.model_validate(spec))
    third.restore({key: state})
    assert third.series[key].detector.n == 60


@pytest.mark.parametrize("section, value", [
    ("power", lambda n: {"hosts": {"h" * n: {}}}),
    ("power", lambda n: {"hosts": {"hv-1": {"generation": "g" * n}}}),
    ("firewall", lambda n: {"roles": {"h" * n: "compute"}}),
    ("firewall", lambda n: {"roles": {"hv-1": "r" * n}}),
])
def test_a_configured_name_a_finding_would_carry_is_bounded_at_load(section: str,
                                                                     value: Callable[[int], dict]) -> None:
    """A host, a generation or a role named in the config becomes a value of the findings' ``where``: beyond the
    record's bound (MAX_WHERE_VALUE) each such finding could not be built; refused at load, naming the key (a long
    key shortened in the message)."""
    with pytest.raises(ValueError, match=rf"streams\.detectors\.{section}\..*at most {MAX_WHERE_VALUE} char"):
        detectors_settings(Settings(streams={"detectors": {section: value(MAX_WHERE_VALUE + 1)}}))
    detectors_settings(Settings(streams={"detectors": {section: value(MAX_WHERE_VALUE)}}))   # at the bound: loads
