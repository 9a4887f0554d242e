"""The real HAProxy's ``show stat`` reply cut at a row boundary (its connection closed mid-answer: a reload,
a crash, a proxy in between), end to end: collector round, the stream stage's demand, the actuator's read-back.
Cut between two rows, the reply parsed as a whole, smaller round: servers silently missing."""

from __future__ import annotations

import socket
import types

import pytest

from opsloop.collectors.haproxy import Config, build
from opsloop.collectors.haproxy import collector as collector_module
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.haproxy import HaproxyTarget
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.streams.edge.demand import DemandAggregator
from tests.collectors.haproxy.cut_reply import CutReply, after_row, whole

pytestmark = pytest.mark.integration


@pytest.fixture
def relay(lab_edge):
    lab_edge.start()
    with CutReply(upstream=lab_edge.admin_socket) as r:
        yield r


def test_real_show_stat_ends_with_one_empty_line(lab_edge) -> None:
    lab_edge.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(lab_edge.admin_socket))
        s.sendall(b"show stat\n")
        reply = b"".join(iter(lambda: s.recv(65536), b""))
    # the last row (its trailing comma), "\n", then the empty line that ends every CLI answer
    assert reply.endswith(b",\n\n") and not reply.endswith(b"\n\n\n")


def _sv(rnd) -> list[tuple[str, str]]:
    return [(m.tags["proxy"], m.tags["sv"]) for m in rnd.metrics]


def test_collector_round_cut_between_two_servers_is_a_parse_error_and_keeps_whole_proxies(relay) -> None:
    collector = build(Config(instances={"edge1": str(relay.path)}))
    assert _sv(collector.collect()) == [("fe_web", "FRONTEND"), ("be_web", "near"), ("be_web", "far"),
                                        ("be_web", "BACKEND")]
    relay.cut = after_row("near")
    rnd = collector.collect()
    # be_web without far (and its BACKEND row) would read as far gone: the whole backend waits a round
    assert _sv(rnd) == [("fe_web", "FRONTEND")]
    [err] = rnd.errors
    assert (err.target, err.kind) == ("edge1", "parse")
    assert err.message.startswith("show stat reply torn: ") and "the last proxy's 1 refused ('be_web'" in err.message
    # every row came, the end did not: all kept, the tear still counted
    relay.cut = after_row("BACKEND")
    rnd = collector.collect()
    assert len(rnd.metrics) == 4 and [e.kind for e in rnd.errors] == ["parse"]
    assert "4 row(s) of whole proxies kept" in rnd.errors[0].message


def test_torn_rounds_do_not_read_as_a_server_gone_from_the_demand(relay, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_800_000_000.0]
    monkeypatch.setattr(collector_module, "time", types.SimpleNamespace(time=lambda: clock[0]))
    collector = build(Config(instances={"edge1": str(relay.path)}))
    demand = DemandAggregator()
    records = []
    for cut in (whole, whole, after_row("near"), after_row("near"), after_row("near"), whole):
        relay.cut = cut
        clock[0] += 10
        records += demand.handle(collector.collect().metrics, clock[0])
    # with far's rows missing from two rounds running, be_web's demand was near's alone (far "removed")
    assert [sorted(r.origins) for r in records] == [["far", "near"], ["far", "near"]]
    assert [r.timestamp - 1_800_000_000 for r in records] == [20, 60]


def test_actuator_read_back_of_a_torn_reply_is_an_error_not_a_server_serving(lab_edge, relay) -> None:
    HaproxyAPI(lab_edge.admin_socket).set_server_state(lab_edge.spec.backend, "far", "maint")   # the operator
    cfg = HaproxyTargetConfig(kind="haproxy", edge="e1", listener="web", socket=relay.path,
                              backend=lab_edge.spec.backend, servers={"near": "near", "far": "far"})
    target = HaproxyTarget(cfg)
    assert target.down() == {"far"}
    relay.cut = after_row("near")
    # far's MAINT row never came: counted serving, every share could be moved onto it
    with pytest.raises(ActuatorError, match="show stat reply torn") as e:
        target.down()
    assert e.value.kind == "parse"

