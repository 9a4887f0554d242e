"""Every stream handler that exports tag values as Prometheus labels bounds them (streams/runtime/gauges.py,
label_value): samples whose tags are 1 MB long, decoded from the wire as the worker decodes them, through
each real handler: no label value in the registry is longer than MAX_LABEL_VALUE, each cut is counted, and
the sample is still used (its series is exported, shortened). Before: the tag went into the label whole."""

from __future__ import annotations

import time
from typing import Any, Callable

import orjson
import pytest
from prometheus_client import REGISTRY

from opsloop.streams.detectors.anomaly.handler import AnomalyHandler
from opsloop.streams.detectors.anomaly.settings import AnomalySettings
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from opsloop.streams.detectors.netperf.handler import NetperfHandler
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.runtime.gauges import MAX_LABEL_VALUE
from opsloop.wire import parse_record

HUGE = "x" * 1_000_000


def _decoded(name: str, tags: dict[str, str], fields: dict[str, Any], ts: float) -> Any:
    parsed = parse_record(orjson.dumps({"name": name, "tags": tags, "fields": fields, "timestamp": ts}))
    assert not parsed.rejected, parsed.rejected
    return parsed.metrics[0]


def _power(t: float) -> list:
    return [_decoded("ipmi_power", {"host": HUGE + "-p", "generation": HUGE + "-g"}, {"watts": 150.0 + i}, t - 60 + i)
            for i in range(5)]


def _firewall(t: float) -> list:
    return [_decoded("iptables_vm_port", {"hypervisor": HUGE + "-f", "role": HUGE + "-r", "port_id": "p1", "vm": "v"},
                     {"protected": 0}, t)]


def _netperf(t: float) -> list:
    return [_decoded("netperf", {"target_set": HUGE + "-n", "label": HUGE + "-l"}, {"throughput_gbps": 9.0}, t - 5 + i)
            for i in range(3)]


def _keystone(t: float) -> list:
    return [_decoded("s3_frontend_requests", {"host": HUGE + "-k"},
                     {"small_requests": 50, "small_p50_ms": 3.0, "small_p95_ms": 9.0}, t - 5 + i) for i in range(3)]


def _anomaly(t: float) -> list:
    return [_decoded("ipmi_power", {"host": HUGE + "-a", "rack": HUGE}, {"watts": 150.0 + (i % 3)}, t - 60 + i)
            for i in range(40)]


HANDLERS: dict[str, tuple[Callable[[], Any], Callable[[float], list], str]] = {
    "power": (PowerHandler, _power, "-p"),
    "firewall": (FirewallHandler, _firewall, "-f"),
    "netperf": (NetperfHandler, _netperf, "-n"),
    "keystone": (KeystoneHandler, _keystone, "-k"),
    "anomaly": (lambda: AnomalyHandler(AnomalySettings.model_validate(
        {"series": [{"metric": "ipmi_power", "field": "watts"}], "detector": {"warmup_points": 5}})), _anomaly, "-a"),
}


def _label_values() -> list[str]:
    return [v for m in REGISTRY.collect() for s in m.samples for v in s.labels.values() if "xxxxxxxx" in v]


def _shortened(handler: str) -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "opsloop_stream_label_values_shortened"
               for s in m.samples if s.name.endswith("_total") and s.labels["handler"] == handler)


@pytest.mark.parametrize("kind", HANDLERS)
def test_a_megabyte_tag_is_a_bounded_label_through_the_handler(kind: str) -> None:
    make, samples, _ = HANDLERS[kind]
    handler = make()
    before, shown = _shortened(handler.name), set(_label_values())
    now = time.time()
    handler.handle(samples(now), now)
    values = set(_label_values()) - shown
    assert values, "the handler exported none of its series: the sample was lost"
    assert max(map(len, values)) <= MAX_LABEL_VALUE, sorted(map(len, values))[-3:]
    assert _shortened(handler.name) > before


def test_the_anomaly_state_of_a_series_with_megabyte_tags_is_bounded() -> None:
    # the series key, its table entry and its finding's where hold the tag set: a 1 MB tag (or tag name)
    # made a changelog record beyond Kafka's 1 MB message size
    make, _, _ = HANDLERS["anomaly"]
    handler = make()
    now = time.time()
    handler.handle([_decoded("ipmi_power", {"host": HUGE + "-s", HUGE[:300_000]: "v"}, {"watts": 150.0 + (i % 3)},
                             now - 60 + i) for i in range(40)], now)
    (key,) = [k for k in handler.series if "xxxxxxxx" in k]
    state = orjson.dumps(handler.state_of(key))
    assert len(key) < 4096 and len(state) < 16384, (len(key), len(state))
    assert all(len(k) <= MAX_LABEL_VALUE and len(v) <= MAX_LABEL_VALUE for k, v in handler.series[key].tags.items())
    assert handler.series[key].detector.explain()["points"] == 40   # every point of the series learned


def test_the_firewall_state_of_a_hypervisor_with_megabyte_names_is_bounded() -> None:
    # a hypervisor's state (its table entry) holds its ports, VMs, packages and their versions
    handler = FirewallHandler()
    now = time.time()
    handler.handle([_decoded("iptables_vm_port", {"hypervisor": "hv-1", "port_id": HUGE + "-port", "vm": HUGE + "-vm"},
                             {"protected": 0, "reason": HUGE}, now),
                    _decoded("iptables_software", {"hypervisor": "hv-1", "package": HUGE + "-pkg"}, {"version": HUGE}, now),
                    _decoded("iptables_ruleset", {"hypervisor": "hv-1"}, {"fingerprint": HUGE}, now)], now)
    state = handler.state_of("hv-1")
    assert state is not None and len(orjson.dumps(state)) < 16384, len(orjson.dumps(state))
    findings = handler.open_findings()
    assert findings and all(len(v) <= MAX_LABEL_VALUE for f in findings for v in f.where.values())
