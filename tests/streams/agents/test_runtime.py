"""The findings sink and the stateful agent loop without a broker; adapters fuzzed with hypothesis."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import orjson
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.stream_workload import Msg
from opsloop.config import Settings
from opsloop.records import Finding, Severity
from opsloop.records import metric
from opsloop.wire import encode_batch
from opsloop.streams.detectors.registry import detector_handlers
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.findings_sink import ActiveFindings, FindingsSink, finding_labels
from opsloop.labels import MAX_LABEL_VALUE
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.agents.settings import DetectorsSettings
from opsloop.streams.agents.stateful import StatefulAgent
from opsloop.streams.detectors.firewall.detector import report_from_metrics

T0 = 1_790_000_000.0


def finding(**where: str) -> Finding:
    return Finding(detector="firewall.unprotected_port", what="VM port without its security-group chain",
                   where=where or {"hypervisor": "hv1", "port": "p1"}, severity=Severity.CRITICAL, score=1.0,
                   first_seen=T0, last_seen=T0)


def exposition(active: ActiveFindings) -> dict[str, list[Any]]:
    reg = CollectorRegistry()
    reg.register(active)
    text = generate_latest(reg).decode()
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


# ---------------------------------------------------------------------------------------------- sink
def test_sink_sends_keyed_by_id_with_event_header_and_tracks_the_gauge() -> None:
    sent: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []

    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        sent.append((key, value, headers))

    active = ActiveFindings()
    sink = FindingsSink(send, active)
    f = finding()
    assert asyncio.run(sink.publish([("opened", f)])) == 1
    key, value, headers = sent[0]
    assert key == f.id.encode() and Finding.decode(value) == f and dict(headers)["event"] == b"opened"
    [sample] = exposition(active)["opsloop_finding_active"]
    assert sample.labels == {"detector": f.detector, "severity": "critical", "id": f.id, "hypervisor": "hv1",
                             "port": "p1"} and sample.value == 1.0
    cleared = f.model_copy(update={"cleared": True, "score": 0.0})
    asyncio.run(sink.publish([("cleared", cleared)]))
    assert [s.value for s in exposition(active)["opsloop_finding_active"]] == [0.0]
    active.cleared_retention_s = -1.0                              # retention over: the series goes away
    assert exposition(active)["opsloop_finding_active"] == []


def test_sink_survives_a_failing_broker() -> None:
    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        raise ConnectionError("broker down")

    active = ActiveFindings()
    assert asyncio.run(FindingsSink(send, active).publish([("opened", finding())])) == 0
    assert exposition(active)["opsloop_finding_active"][0].value == 1.0   # still shown locally


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=300), max_size=8))
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_any_where_labels_give_a_valid_exposition(where: dict[str, str]) -> None:
    f = Finding(detector="x.y", what="w", where=where, first_seen=T0, last_seen=T0)
    labels = finding_labels(f)
    assert labels["detector"] == "x.y" and labels["id"] == f.id
    active = ActiveFindings()
    active.update(f)
    [sample] = exposition(active)["opsloop_finding_active"]      # the parser accepts what we expose
    assert sample.labels == labels and all(len(v) <= MAX_LABEL_VALUE for v in labels.values())


# ------------------------------------------------------------------------------------- agent loop

class Event:
    def __init__(self, msg: Msg) -> None:
        self.message = msg


class FakeTable(dict):
    """Records (key, partition of the current event) of every write, like a changelog would."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, int]] = []

    def __setitem__(self, key: str, value: Any) -> None:
        from faust.streams import current_event

        self.writes.append((key, current_event().message.partition))
        super().__setitem__(key, orjson.loads(orjson.dumps(value)))   # JSON, as the changelog stores it


def loop_for(handler: DetectorHandler, table: FakeTable, sent: list[tuple[bytes, bytes, Any]],
             *more: DetectorHandler) -> StatefulAgent:
    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        sent.append((key, value, headers))

    app = faust.App("agents-unit", broker="kafka://127.0.0.1:1", value_serializer="raw")
    sink = FindingsSink(send, ActiveFindings())
    agent = StatefulAgent(app, [handler, *more], Settings(), table, sink)  # type: ignore[arg-type]

    async def no_deadletters(dl: Any) -> None:
        raise AssertionError(f"unexpected dead letter {dl.reason}")

    agent._send_deadletter = no_deadletters  # type: ignore[method-assign]
    agent._highwater = lambda topic, partition: None  # type: ignore[method-assign]
    return agent


def round_event(hv: str, ts: float, partition: int, offset: int, open_port: bool) -> Event:
    from tests.streams.agents.test_handlers import iptables_round

    return Event(Msg("telemetry.iptables", partition, offset, hv.encode(),
                     encode_batch(iptables_round(hv, ts, {"p1": not open_port, "p2": True}))))


def test_loop_writes_each_key_once_per_batch_into_its_partition_and_restores() -> None:
    table, sent = FakeTable(), []
    agent = loop_for(FirewallHandler(), table, sent)
    batch = [round_event("hv-a", T0, 0, 0, True), round_event("hv-b", T0, 3, 0, False),
             round_event("hv-a", T0 + 60, 0, 1, True)]               # hv-a twice in one batch
    asyncio.run(agent.run_batch(batch))
    assert sorted(table.writes) == [("firewall-detector|hv-a", 0), ("firewall-detector|hv-b", 3)]
    assert [dict(h)["event"] for _, _, h in sent] == [b"opened"]
    assert table["firewall-detector|hv-a"]["book"]["open"]

    # A restarted worker: a new handler restored from the table sends no new "opened".
    sent2: list[Any] = []
    agent2 = loop_for(FirewallHandler(), table, sent2)
    asyncio.run(agent2.run_batch([round_event("hv-a", T0 + 120, 0, 2, True)]))
    assert sent2 == []
    assert agent2.handlers[0].open_findings()[0].first_seen == T0
    asyncio.run(agent2.run_batch([round_event("hv-a", T0 + 180, 0, 3, False)]))
    assert [dict(h)["event"] for _, _, h in sent2] == [b"cleared"]
    assert table["firewall-detector|hv-a"]["book"]["open"] == {}


def test_loop_dead_letters_bad_records_and_keeps_going() -> None:
    table, sent = FakeTable(), []
    agent = loop_for(FirewallHandler(), table, sent)
    letters: list[str] = []

    async def collect(dl: Any) -> None:
        letters.append(dl.reason)

    agent._send_deadletter = collect  # type: ignore[method-assign]
    bad = Event(Msg("telemetry.iptables", 1, 0, b"x", b"{not json"))
    asyncio.run(agent.run_batch([bad, round_event("hv-c", T0, 1, 1, True)]))
    assert len(letters) == 1 and "not JSON" in letters[0]
    assert [dict(h)["event"] for _, _, h in sent] == [b"opened"]


class Broken(FirewallHandler):
    name = "broken-detector"

    def process(self, metrics: Any, now: float) -> None:
        raise KeyError("bug")


def test_a_failing_handler_does_not_starve_the_others_and_its_batch_is_dead_lettered_once() -> None:
    table, sent = FakeTable(), []
    agent = loop_for(FirewallHandler(), table, sent, Broken())
    letters: list[str] = []

    async def collect(dl: Any) -> None:
        letters.append(dl.reason)

    agent._send_deadletter = collect  # type: ignore[method-assign]
    asyncio.run(agent.run_batch([round_event("hv-d", T0, 2, 0, True)]))
    assert [dict(h)["event"] for _, _, h in sent] == [b"opened"]          # the firewall still paged
    assert letters and all("broken-detector: KeyError" in r for r in letters)
    assert [k for k, _ in table.writes] == ["firewall-detector|hv-d"]


# ------------------------------------------------------------------------------------------ fuzzing
_names = st.sampled_from(["iptables_vm_port", "iptables_ruleset", "iptables_software", "firewall_port",
                          "firewall_host", "ipmi_power", "ipmi_sensor", "netperf_throughput", "netperf",
                          "keystone_probe", "keystone_requests", "s3_frontend_credential", "s3_frontend_requests",
                          "uwsgi_server"])
_tag_keys = st.sampled_from(["host", "hypervisor", "port_id", "vm", "role", "package", "generation",
                             "raw_capacity_tb", "target_set", "queues", "label", "probe", "endpoint", "method",
                             "access_key", "name", "unit", "port"])
_field_keys = st.sampled_from(["protected", "reason", "base_fingerprint", "version", "chain_present", "watts",
                               "value", "mean_gbps", "failed_targets", "throughput_gbps", "count", "p50_ms",
                               "keystone_validations", "small_requests", "small_p50_ms", "small_p95_ms",
                               "listen_queue", "ruleset_fingerprint", "pkg_x"])
_values = st.one_of(st.integers(-5, 10**6), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
                    st.booleans(), st.text(max_size=12))
_samples = st.builds(lambda n, t, f, dt: metric(n, f, t, T0 + dt), _names,
                     st.dictionaries(_tag_keys, st.text(min_size=1, max_size=8), max_size=5),
                     st.dictionaries(_field_keys, _values, min_size=1, max_size=5), st.integers(0, 5000))


@given(st.lists(_samples, max_size=40))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_handlers_never_crash_and_state_stays_json(samples: list) -> None:
    for h in detector_handlers(DetectorsSettings()):
        h.handle(samples, T0)
        h.drain_outbox()
        for key in h.touched():
            state = h.state_of(key)
            assert state is None or orjson.loads(orjson.dumps(state)) == orjson.loads(orjson.dumps(state))
    report_from_metrics(samples)
