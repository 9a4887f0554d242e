"""What the stream stage's throughput work must not change: state keys, caps, finding books, drift, GC.

Each fast path here stands next to the slow one it replaces and must give the same result.
"""

from __future__ import annotations

import gc

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from opsloop.config import StreamSettings
from opsloop.records import Severity
from opsloop.labels import _LABEL_ESCAPES, label_string
from opsloop.records import Metric, metric
from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings, SeriesSpec
from opsloop.streams.detectors.findingbook import FindingBook
from opsloop.streams.detectors.firewall.detector import FirewallDetector, report_from_metrics
from opsloop.streams.lb.rates import LbRates
from opsloop.streams.runtime.batch import gc_paused

T0 = 1_790_000_000.0


def reference_label_string(labels: dict[str, str]) -> str:
    """The escaping join, without the fast path."""
    return ",".join(f"{str(k).translate(_LABEL_ESCAPES)}={str(v).translate(_LABEL_ESCAPES)}"
                    for k, v in sorted(labels.items()))


@given(st.dictionaries(st.text(alphabet="ab,=|\\x ", max_size=4), st.text(alphabet="ab,=|\\x ", max_size=4),
                       max_size=4))
def test_label_string_fast_path_equals_the_escaping_join(labels: dict[str, str]) -> None:
    assert label_string(labels) == reference_label_string(labels)


def test_label_string_keeps_skip_and_non_string_values() -> None:
    assert label_string({"b": 2, "a": "x,y", "c": "z"}, skip=["c"]) == "a=x\\,y,b=2"  # type: ignore[dict-item]


def test_anomaly_tag_values_with_separators_are_distinct_series() -> None:
    h = AnomalyHandler(AnomalySettings(series=[SeriesSpec(metric="ipmi_power", field="watts")]))
    h.handle([metric("ipmi_power", {"watts": 150.0}, {"host": "a,rack=1"}, T0),
              metric("ipmi_power", {"watts": 150.0}, {"host": "a", "rack": "1"}, T0)], T0)
    assert len(h.series) == 2
    assert sorted(h.series) == ["ipmi_power.watts|host=a,rack=1", "ipmi_power.watts|host=a\\,rack\\=1"]


def test_lb_rates_cap_is_stream_max_state_keys() -> None:
    rates = LbRates.from_settings(StreamSettings(max_state_keys=3, series_ttl_s=600))
    before = REGISTRY.get_sample_value("opsloop_stream_state_dropped_total",
                                       {"handler": "lb-rates", "reason": "cap"}) or 0.0
    rows = [metric("haproxy", {"hrsp_2xx": 10}, {"host": "capped-lb", "proxy": "be", "sv": f"s{i}", "type": "server"},
                   T0) for i in range(5)]
    rates.handle(rows, T0)
    after = REGISTRY.get_sample_value("opsloop_stream_state_dropped_total", {"handler": "lb-rates", "reason": "cap"})
    assert len(rates._recent) == 3   # noqa: SLF001
    assert after == before + 2


def _raise(book: FindingBook, host: str, now: float) -> None:
    book.raise_(detector="power.cost", what="w", where={"host": host}, observed=1.0, expected=None, score=0.1,
                severity=Severity.INFO, explanation="e", now=now)


def test_finding_book_split_follows_every_change() -> None:
    book = FindingBook()
    _raise(book, "a", T0)
    assert set(book.split("host")) == {"a"}
    _raise(book, "b", T0)
    assert set(book.split("host")) == {"a", "b"}
    book.clear("power.cost", {"host": "a"}, T0 + 1, "gone")
    assert set(book.split("host")) == {"b"}
    other = FindingBook()
    _raise(other, "c", T0)
    book.merge(other)
    assert set(book.split("host")) == {"b", "c"}
    assert book.split("host")["c"].open == other.open


def _fw_round(hv: str, ts: float, fp: str, ports: int = 3) -> list[Metric]:
    out = [metric("iptables_vm_port", {"protected": 1}, {"host": hv, "port_id": f"p{j}", "vm": f"vm{j}"}, ts)
           for j in range(ports)]
    out.append(metric("iptables_ruleset", {"fingerprint": fp, "base_fingerprint": fp}, {"host": hv}, ts))
    return out


def test_firewall_drift_once_per_batch_gives_the_per_report_findings() -> None:
    # five hypervisors, two rounds in one batch; hv3 drifts in the second round, hv1 is back in line
    batch = [*(m for i in range(5) for m in _fw_round(f"hv{i}", T0, "fp-b" if i == 1 else "fp-a")),
             *(m for i in range(5) for m in _fw_round(f"hv{i}", T0 + 60, "fp-b" if i == 3 else "fp-a"))]
    per_report = FirewallDetector()
    for rep in report_from_metrics(batch):
        per_report.update(rep)
    h = FirewallHandler()
    h.handle(batch, T0 + 60)
    assert set(h.detector.book.open) == set(per_report.book.open)
    assert [d["where"]["hypervisor"] for d in h.detector.book.open.values()] == ["hv3"]
    assert REGISTRY.get_sample_value("opsloop_firewall_drift",
                                     {"hypervisor": "hv3", "role": "default", "kind": "ruleset"}) == 1.0
    assert REGISTRY.get_sample_value("opsloop_firewall_drift",
                                     {"hypervisor": "hv1", "role": "default", "kind": "ruleset"}) == 0.0


def test_gc_paused_restores_the_collector_state() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()   # a caller's own pause is left alone
    finally:
        gc.enable()
    try:
        with gc_paused():
            raise ValueError("handler bug")
    except ValueError:
        pass
    assert gc.isenabled()


def test_detectors_agent_reads_the_prefixed_topics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from opsloop.config import Settings
    from opsloop.streams.worker import build_app

    app = build_app(Settings.model_validate({"kafka": {"topic_prefix": "site1."},
                                             "stream": {"data_dir": str(tmp_path / "streams")}}))
    topics = {name: sorted(agent.channel.topics) for name, agent in app.agents.items()}
    assert topics["lb"] == ["site1.telemetry.lb"]
    assert topics["detectors"] == ["site1.telemetry.ipmi", "site1.telemetry.iptables", "site1.telemetry.keystone",
                                   "site1.telemetry.netperf"]


def test_fan_out_split_by_name_gives_every_handler_what_the_whole_batch_gives() -> None:
    """The worker's handlers behind a FanOut see only their names; fed every sample instead (each
    picking its own, the slow path), they must end with the same state, findings and demand records."""
    from bench.stream_workload import Fleet, Msg, fleet_round
    from opsloop.streams.agents.settings import DetectorsSettings
    from opsloop.streams.detectors.registry import detector_handlers
    from opsloop.streams.edge.demand import DemandAggregator
    from opsloop.streams.runtime.batch import FanOut, decode_messages

    def handlers() -> list:   # type: ignore[type-arg]
        rates = LbRates()
        return [rates, DemandAggregator(rates=rates), *detector_handlers(DetectorsSettings())]

    routed, whole = handlers(), handlers()
    fan = FanOut("all", routed)
    fleet = Fleet(lbs=2, servers_per_lb=3, hosts=6, sensors=3, hypervisors=4, ports=3, keystones=2, credentials=3,
                  netperf_sets=2)
    for n in range(4):
        ts = T0 + 15 * n
        msgs = [Msg(t, 0, i, k, v) for i, (t, k, v) in enumerate(fleet_round(fleet, n, T0))]   # stamped ts
        # first, the same host's total power from a sensor too (same event time: the first one counts)
        batch = [
            metric("ipmi_sensor", {"value": 400.0 + n}, {"host": "srv0", "name": "total_power", "unit": "Watts"}, ts),
            *decode_messages(msgs, now=ts).metrics,
            metric("iptables_vm_port", {"protected": 0}, {"host": "hv1", "port_id": "px", "vm": "vm-x"}, ts),
            metric("cpu", {"usage": 1.0}, {"host": "srv0"}, ts)]   # nobody reads it
        fan.handle(batch, ts)
        for h in whole:
            h.handle(batch, ts)
        for a, b in zip(routed, whole):
            if isinstance(a, DemandAggregator):
                assert a.drain() == b.drain() and a.status == b.status
            elif isinstance(a, LbRates):
                assert a.latest == b.latest and a.fresh == b.fresh
            else:
                assert a.drain_outbox() == b.drain_outbox(), a.name
                keys = a.touched()
                assert keys == b.touched(), a.name
                assert keys and all(a.state_of(k) == b.state_of(k) for k in keys), a.name
    assert any(d["detector"] == "firewall.unprotected_port" for d in routed[2].detector.book.open.values())
