"""LVS actuator: ipvsadm batches (a recording fake; this kernel has no IPVS), read-back, parser fuzzing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from opsloop.audit.trail import AuditLog
from opsloop.config import Settings

from opsloop.lb.ipvs import LvsParseError, parse_proc_ip_vs
from opsloop.controllers.actuators import metrics
from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import ActuatorConfigError, LvsTargetConfig, actuator_config
from opsloop.controllers.actuators.lvs import LvsTarget, parse_ipvsadm_list
from opsloop.controllers.actuators.store import WeightStore
from tests.controllers.actuators.support import ListSink, decision
from tests.controllers.actuators.fake_ipvsadm import listing
from tests.helpers import REPO, unique

HERE = Path(__file__).parent
TESTDATA = REPO / "collectors" / "lvs" / "testdata"


def seed_state() -> dict:
    """The services of the recorded /proc/net/ip_vs, as the fake's state."""
    services = []
    for s in parse_proc_ip_vs((TESTDATA / "proc_net_ip_vs.txt").read_text()):
        host = lambda a, fam: f"[{a}]" if fam == "inet6" else a  # noqa: E731
        addr = str(s.key.fwmark) if s.key.protocol == "fwm" else f"{host(s.key.address, s.key.family)}:{s.key.port}"
        services.append({"proto": s.key.protocol.upper(), "addr": addr, "sched": s.scheduler,
                         "reals": [{"addr": f"{host(r.key.address, r.key.family)}:{r.key.port}", "fwd": r.forward,
                                    "w": r.weight, "active": r.active, "inactive": r.inactive} for r in s.reals]})
    return {"services": services}


@pytest.fixture
def fake(tmp_path: Path):
    state = tmp_path / "ipvs.json"
    state.write_text(json.dumps(seed_state()))
    return state


def weights_in(state: Path, service: str) -> dict[str, tuple[int, str]]:
    doc = json.loads(state.read_text())
    svc = next(s for s in doc["services"] if s["addr"] == service)
    return {r["addr"]: (r["w"], r["fwd"]) for r in svc["reals"]}


def calls(state: Path) -> list[dict]:
    p = Path(str(state) + ".calls")
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def lvs_actuator(state: Path, tmp: Path, service: str, reals: dict[str, str], **kw) -> tuple[EdgeActuator, ListSink]:
    edge = unique("lvs")
    cfg = LvsTargetConfig(kind="lvs", edge=edge, listener="app", service=service, reals=reals,
                          command=[sys.executable, str(HERE / "fake_ipvsadm.py"), "--state", str(state)])
    sink = ListSink()
    return EdgeActuator(LvsTarget(cfg), edge, "app", WeightStore(tmp / "store", edge, "app"), AuditLog([sink]),
                        weight_total=cfg.weight_total, **kw), sink


REALS = {"eu": "192.168.82.21:3306", "us": "192.168.50.21:3306", "spare": "192.168.84.22:3306"}


def test_apply_is_one_batch_keeps_forwarding_and_reads_back(fake: Path, tmp_path: Path) -> None:
    act, sink = lvs_actuator(fake, tmp_path, "tcp:192.168.0.57:3306", REALS)
    assert act.read() == {"eu": 100, "us": 100, "spare": 0}
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert weights_in(fake, "192.168.0.57:3306") == {"192.168.82.21:3306": (7000, "Tunnel"),
                                                      "192.168.50.21:3306": (3000, "Tunnel"),
                                                      "192.168.84.22:3306": (0, "Tunnel")}
    restores = [c for c in calls(fake) if c["argv"] == ["-R"]]
    assert len(restores) == 1  # one batch per edge
    assert restores[0]["stdin"].splitlines() == [
        "-e -t 192.168.0.57:3306 -r 192.168.82.21:3306 -i -w 7000",
        "-e -t 192.168.0.57:3306 -r 192.168.50.21:3306 -i -w 3000",
        "-e -t 192.168.0.57:3306 -r 192.168.84.22:3306 -i -w 0"]
    assert [c["argv"] for c in calls(fake)][-1] == ["-Ln", "--exact"]  # read back after the batch
    n = len(calls(fake))
    assert act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app")).result == "noop"
    assert len(calls(fake)) == n  # noop: ipvsadm not even run


def test_ipv6_and_fwmark_services(fake: Path, tmp_path: Path) -> None:
    act, _ = lvs_actuator(fake, tmp_path, "tcp:[2620::1]:80", {"a": "[2620::2]:80", "b": "[2620::3]:80",
                                                               "c": "[2620::4]:80"})
    assert act.apply(decision(1, {"a": 0.5, "b": 0.25, "c": 0.25}, edge=act.edge, listener="app")).result == "applied"
    assert [w for w, _ in weights_in(fake, "[2620::1]:80").values()] == [5000, 2500, 2500]
    fwm, _ = lvs_actuator(fake, tmp_path, "fwm:268439552", {"x": "192.168.50.26:3306", "y": "192.168.50.21:3306"})
    assert fwm.apply(decision(1, {"x": 0.2, "y": 0.8}, edge=fwm.edge, listener="app")).result == "applied"
    assert "-e -f 268439552 -r 192.168.50.26:3306 -g -w 2000" in calls(fake)[-2]["stdin"]


def test_mismatch_when_ipvsadm_ignores_the_batch(fake: Path, tmp_path: Path) -> None:
    Path(str(fake) + ".mode").write_text("freeze")
    act, sink = lvs_actuator(fake, tmp_path, "tcp:192.168.0.57:3306", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "mismatch" and sink.records[-1].result == "mismatch"
    assert metrics.ERRORS.labels(act.edge, "mismatch")._value.get() == 1
    assert act.store.history() == []


def test_ipvsadm_failing_then_recovering(fake: Path, tmp_path: Path) -> None:
    mode = Path(str(fake) + ".mode")
    mode.write_text("fail")
    act, sink = lvs_actuator(fake, tmp_path, "tcp:192.168.0.57:3306", REALS)
    r = act.apply(decision(1, {"eu": 0.6, "us": 0.4}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "Can't initialize ipvs" in r.reason
    assert metrics.ERRORS.labels(act.edge, "unreachable")._value.get() == 1
    mode.unlink()
    assert act.apply(decision(1, {"eu": 0.6, "us": 0.4}, edge=act.edge, listener="app")).result == "applied"
    assert weights_in(fake, "192.168.0.57:3306")["192.168.82.21:3306"] == (6000, "Tunnel")


def test_failed_batch_is_rolled_back(fake: Path, tmp_path: Path) -> None:
    act, sink = lvs_actuator(fake, tmp_path, "tcp:192.168.0.57:3306", REALS)
    # the last real server disappears between read and write (a racing keepalived): line 3 fails
    original = act.target._live
    seen = []

    def live_then_remove():
        out = original()
        seen.append(1)
        if len(seen) != 2:  # 1st: the applier's read; 2nd: inside write, just before the batch
            return out
        doc = json.loads(fake.read_text())
        svc = next(s for s in doc["services"] if s["addr"] == "192.168.0.57:3306")
        svc["reals"] = [x for x in svc["reals"] if x["addr"] != "192.168.84.22:3306"]
        fake.write_text(json.dumps(doc))
        return out

    act.target._live = live_then_remove  # type: ignore[method-assign]
    r = act.apply(decision(1, {"eu": 0.5, "us": 0.3, "spare": 0.2}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "No such destination" in r.reason
    # the two lines ipvsadm had applied before failing were put back
    assert weights_in(fake, "192.168.0.57:3306") == {"192.168.82.21:3306": (100, "Tunnel"),
                                                      "192.168.50.21:3306": (100, "Tunnel")}
    assert len([c for c in calls(fake) if c["argv"] == ["-R"]]) == 2


def test_real_ipvsadm_on_this_kernel_is_a_clear_error(tmp_path: Path) -> None:
    binary = shutil.which("ipvsadm") or "/usr/sbin/ipvsadm"
    cfg = LvsTargetConfig(kind="lvs", edge="e", listener="l", service="tcp:192.0.2.10:443",
                          reals={"eu": "10.0.0.1:443"}, command=[binary])
    with pytest.raises(ActuatorError) as e:
        LvsTarget(cfg).read()
    assert e.value.kind == "unreachable" and "initialize ipvs" in str(e.value)


@pytest.mark.parametrize("mode, body", [(0o644, "#!/bin/sh\nexit 0\n"), (0o755, "exit 0\n")])
def test_an_ipvsadm_that_cannot_be_executed_is_the_actuators_error(tmp_path: Path, mode: int, body: str) -> None:
    """Not executable (mode 0644) or no #! line (exec format error): an ActuatorError naming the file, as a missing
    ipvsadm is. Old code: only FileNotFoundError was caught, the raw PermissionError/OSError escaped the target."""
    tool = tmp_path / "ipvsadm"
    tool.write_text(body)
    tool.chmod(mode)
    cfg = LvsTargetConfig(kind="lvs", edge="e", listener="l", service="tcp:192.0.2.10:443",
                          reals={"eu": "10.0.0.1:443"}, command=[str(tool)])
    with pytest.raises(ActuatorError) as e:
        LvsTarget(cfg).read()
    assert e.value.kind == "unreachable" and f"cannot execute {tool}" in str(e.value)


@pytest.mark.parametrize("bad, needle", [
    ({"service": "http:1.2.3.4:80"}, "http:1.2.3.4:80"),
    ({"service": "tcp:1.2.3.4"}, "ADDRESS:PORT"),
    ({"service": "tcp:2620::1:80"}, "brackets"),
    ({"reals": {"eu": "10.0.0.300:80"}}, "eu"),
])
def test_config_errors_name_the_value(bad: dict, needle: str) -> None:
    target = {"edge": "e", "listener": "l", "kind": "lvs", "service": "tcp:192.0.2.10:443",
              "reals": {"eu": "10.0.0.1:443"}, **bad}
    with pytest.raises(ActuatorConfigError, match="targets") as e:
        actuator_config(Settings(controllers={"actuator": {"targets": [target]}}))
    assert needle in str(e.value)


def test_listing_parser_reads_the_fake_output() -> None:
    services = parse_ipvsadm_list(listing(seed_state()))
    assert [s.key.label for s in services] == ["tcp:192.168.0.22:3306", "tcp:192.168.0.57:3306",
                                               "tcp:192.168.0.55:3306", "tcp:[2620::1]:80", "fwm:268439552"]
    assert [(r.forward, r.weight, r.active) for r in services[0].reals][0] == ("Tunnel", 100, 248)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_listing_parser_fuzz(text: str) -> None:
    try:
        parse_ipvsadm_list("IP Virtual Server version 1.2.1 (size=4096)\n" + text)
    except LvsParseError as e:
        assert "line" in str(e)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 65535), st.sampled_from(["Route", "Masq", "Tunnel"]),
                          st.integers(0, 10**6)), min_size=1, max_size=6))
def test_listing_round_trip(reals: list[tuple[int, str, int]]) -> None:
    state = {"services": [{"proto": "UDP", "addr": "198.51.100.7:53", "sched": "rr",
                           "reals": [{"addr": f"10.0.0.{i + 1}:53", "fwd": f, "w": w, "active": a, "inactive": 0}
                                     for i, (w, f, a) in enumerate(reals)]}]}
    svc = parse_ipvsadm_list(listing(state))[0]
    assert svc.key.label == "udp:198.51.100.7:53"
    assert [(r.weight, r.forward, r.active) for r in svc.reals] == reals
