"""LVS actuator and IPv6: firewall-mark services of either family, IPv6 virtual and real addresses.

The kernel keys a firewall-mark service by (family, mark): ``ipvsadm -A -f 1`` and ``-A -f 1 -6`` are two
services, listed ``FWM  1`` and ``FWM  1 IPv6`` (ipvsadm.c ``print_service_entry``); an edit names the IPv6 one
only with ``-6`` after ``-f`` (``parse_options``). A real of a mark service added without a port is listed ``:0``.

Before (old code): the config took no form for the IPv6 mark service (``fwm6:1`` refused, the collector's label
for it), ``service_args`` never wrote ``-6``, a real ``[2001:db8::2]:0`` was refused (port 0), a ``fwm:1`` whose
live service is IPv6-only failed as "not in ipvsadm -Ln" without saying why, and a mark beyond ipvsadm's 32 bits
or an IPv6 scope id passed the config check and failed every batch.
ipvsadm needs an IPVS kernel: ``fake_ipvsadm6.py`` prints and edits in ipvsadm 1.31's format.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from opsloop.audit.trail import AuditLog
from opsloop.config import Settings

from opsloop.controllers.actuators.applier import EdgeActuator
from opsloop.controllers.actuators.config import ActuatorConfigError, LvsTargetConfig, actuator_config
from opsloop.controllers.actuators.lvs import LvsTarget
from opsloop.controllers.actuators.store import WeightStore
from opsloop.lb.ipvs import ServiceKey
from tests.controllers.actuators.support import ListSink, decision
from tests.controllers.actuators.fake_ipvsadm import listing
from tests.helpers import unique

HERE = Path(__file__).parent
FAKE = HERE / "fake_ipvsadm6.py"


def real(addr: str, w: int, fwd: str = "Route") -> dict:
    return {"addr": addr, "fwd": fwd, "w": w, "active": 0, "inactive": 0}


def state(v4: bool = True) -> dict:
    """FWM 1 of both families (IPv4 listed first, as ipvsadm sorts) and an IPv6 TCP service."""
    services = [{"proto": "FWM", "addr": "1", "sched": "wlc", "reals": [real("10.0.0.2:0", 100),
                                                                       real("10.0.0.3:0", 100)]}] if v4 else []
    services += [
        {"proto": "FWM", "addr": "1 IPv6", "sched": "wlc", "reals": [real("[2001:db8::2]:0", 100),
                                                                     real("[2001:db8::3]:0", 100)]},
        {"proto": "TCP", "addr": "[2001:db8::1]:443", "sched": "wrr",
         "reals": [real("[2001:db8:0:1::10]:8443", 100, "Masq"), real("[2001:db8:0:2::10]:8443", 100, "Masq")]}]
    return {"services": services}


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "ipvs.json"
    path.write_text(json.dumps(state()))
    return path


def weights(path: Path, service: str) -> dict[str, int]:
    svc = next(s for s in json.loads(path.read_text())["services"] if s["addr"] == service)
    return {r["addr"]: r["w"] for r in svc["reals"]}


def restores(path: Path) -> list[str]:
    calls = [json.loads(x) for x in Path(f"{path}.calls").read_text().splitlines()]
    return [c["stdin"] for c in calls if c["argv"] == ["-R"]]


def actuator(path: Path, tmp: Path, service: str, reals: dict[str, str]) -> tuple[EdgeActuator, ListSink]:
    edge = unique("lvs6")
    cfg = LvsTargetConfig(kind="lvs", edge=edge, listener="app", service=service, reals=reals,
                          command=[sys.executable, str(FAKE), "--state", str(path)])
    sink = ListSink()
    return EdgeActuator(LvsTarget(cfg), edge, "app", WeightStore(tmp / "store", edge, "app"), AuditLog([sink]),
                        weight_total=cfg.weight_total, max_step=1.0), sink


def test_the_listing_the_fake_prints_is_ipvsadms() -> None:
    # print_service_entry: "FWM  %d IPv6", then "%s %s" with the scheduler; reals "  -> %-28s %-7s %-6d ..."
    assert f"\nFWM  1 IPv6 wlc\n  -> {'[2001:db8::2]:0':<28} {'Route':<7} {100:<6d} " in listing(state())


def test_an_ipv6_firewall_mark_service_is_driven_with_dash_6(fake: Path, tmp_path: Path) -> None:
    act, _ = actuator(fake, tmp_path, "fwm6:1", {"a": "[2001:db8::2]:0", "b": "[2001:db8::3]:0"})
    assert act.target.service == ServiceKey("fwm", fwmark=1, family="inet6")
    assert act.read() == {"a": 100, "b": 100}   # the IPv6 service's reals, not FWM 1's IPv4 ones
    r = act.apply(decision(1, {"a": 0.7, "b": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert restores(fake)[-1].splitlines() == ["-e -f 1 -6 -r [2001:db8::2]:0 -g -w 7000",
                                               "-e -f 1 -6 -r [2001:db8::3]:0 -g -w 3000"]
    assert weights(fake, "1 IPv6") == {"[2001:db8::2]:0": 7000, "[2001:db8::3]:0": 3000}
    assert weights(fake, "1") == {"10.0.0.2:0": 100, "10.0.0.3:0": 100}   # the IPv4 service of mark 1 untouched
    # drift on the IPv6 service is put back there too
    doc = json.loads(fake.read_text())
    doc["services"][1]["reals"][0]["w"] = 5
    fake.write_text(json.dumps(doc))
    assert act.reconcile().result == "applied"   # type: ignore[union-attr]
    assert weights(fake, "1 IPv6") == {"[2001:db8::2]:0": 7000, "[2001:db8::3]:0": 3000}


def test_the_ipv4_mark_service_beside_it_is_still_driven_without_dash_6(fake: Path, tmp_path: Path) -> None:
    act, _ = actuator(fake, tmp_path, "fwm:1", {"a": "10.0.0.2:0", "b": "10.0.0.3:0"})
    assert act.apply(decision(1, {"a": 0.25, "b": 0.75}, edge=act.edge, listener="app")).result == "applied"
    assert sorted(restores(fake)[-1].splitlines()) == ["-e -f 1 -r 10.0.0.2:0 -g -w 2500",
                                                       "-e -f 1 -r 10.0.0.3:0 -g -w 7500"]
    assert weights(fake, "1 IPv6") == {"[2001:db8::2]:0": 100, "[2001:db8::3]:0": 100}


def test_fwm_configured_for_an_ipv6_only_mark_says_which_form_to_use(tmp_path: Path) -> None:
    path = tmp_path / "ipvs.json"
    path.write_text(json.dumps(state(v4=False)))
    act, sink = actuator(path, tmp_path, "fwm:1", {"a": "[2001:db8::2]:0", "b": "[2001:db8::3]:0"})
    r = act.apply(decision(1, {"a": 0.5, "b": 0.5}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "fwm:1 not in ipvsadm -Ln" in r.reason
    assert "the IPv6 one is: configure fwm6:1" in r.reason, r.reason   # old code: nothing said why
    assert sink.records[-1].result == "failed"


def test_an_ipv6_virtual_address_in_any_spelling_is_written_as_ipvsadm_lists_it(fake: Path, tmp_path: Path) -> None:
    act, _ = actuator(fake, tmp_path, "tcp:[2001:DB8:0::1]:443",
                      {"x": "[2001:db8:0:1:0:0:0:10]:8443", "y": "[2001:db8:0:2::10]:8443"})
    assert act.apply(decision(1, {"x": 0.6, "y": 0.4}, edge=act.edge, listener="app")).result == "applied"
    assert restores(fake)[-1].splitlines() == ["-e -t [2001:db8::1]:443 -r [2001:db8:0:1::10]:8443 -m -w 6000",
                                               "-e -t [2001:db8::1]:443 -r [2001:db8:0:2::10]:8443 -m -w 4000"]
    assert weights(fake, "[2001:db8::1]:443") == {"[2001:db8:0:1::10]:8443": 6000, "[2001:db8:0:2::10]:8443": 4000}


@pytest.mark.parametrize("service, reals, needle", [
    ("fwm6:0", {"eu": "[2001:db8::2]:0"}, "'fwm6:0': firewall mark must be an integer 1..4294967295"),
    ("fwm6:x", {"eu": "[2001:db8::2]:0"}, "'fwm6:x'"),
    ("fwm:4294967296", {"eu": "10.0.0.2:0"}, "'fwm:4294967296': firewall mark"),   # old code: accepted
    ("fwm7:1", {"eu": "10.0.0.2:0"}, "fwm:MARK or fwm6:MARK"),
    ("fwm6:1", {"eu": "2001:db8::2:0"}, "reals['eu']"),
    ("fwm6:1", {"eu": "[2001:db8::zz]:0"}, "reals['eu']"),
    ("tcp:192.0.2.10:443", {"eu": "10.0.0.1:0"}, "reals['eu']"),   # port 0: mark services only
    ("tcp:[fe80::1%eth0]:443", {"eu": "[fe80::2]:443"}, "scope id"),
    ("tcp:[2001:db8::1]:443", {"eu": "[fe80::2%eth0]:443"}, "reals['eu']"),
])
def test_config_errors_name_the_field_and_value(service: str, reals: dict[str, str], needle: str) -> None:
    target = {"edge": "e", "listener": "l", "kind": "lvs", "service": service, "reals": reals}
    with pytest.raises(ActuatorConfigError) as e:
        actuator_config(Settings(controllers={"actuator": {"targets": [target]}}))
    assert needle in str(e.value) and "targets" in str(e.value), str(e.value)


def test_one_mark_of_each_family_are_two_services_to_configure(tmp_path: Path) -> None:
    targets = [{"edge": "e", "listener": lst, "kind": "lvs", "service": svc, "reals": {"eu": r}}
               for lst, svc, r in (("v4", "fwm:1", "10.0.0.2:0"), ("v6", "fwm6:1", "[2001:db8::2]:0"))]
    config = actuator_config(Settings(controllers={"actuator": {"targets": targets}}))
    assert [t.service for t in config.targets] == ["fwm:1", "fwm6:1"]
    twice = [*targets, {**targets[1], "listener": "again"}]
    with pytest.raises(ActuatorConfigError, match="both drive virtual service 'fwm6:1'"):
        actuator_config(Settings(controllers={"actuator": {"targets": twice}}))
