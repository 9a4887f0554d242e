"""A tunnelled LVS real's encapsulation (``--tun-type gue --tun-port 6080 --tun-csum``, ``--tun-type gre``; kernel
>= 5.2, ipvsadm >= 1.30) survives the actuator's batches. libipvs sends the tunnel type, port and flags with every
edit and the kernel sets them (``__ip_vs_update_dest``), so an ``-e`` without them made the real an IPIP one: its
traffic sent in an encapsulation the real does not take (lost), by every apply, reconcile and undo. The recording
fake does what ipvsadm and the kernel do (``-Ln --tun-info`` in ipvsadm's layout, edits reset to ipip)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsloop.controllers.actuators import lvs, metrics
from opsloop.controllers.actuators.base import ActuatorError
from tests.controllers.actuators.test_lvs import REALS, calls, lvs_actuator, seed_state, weights_in
from tests.controllers.actuators.support import decision

SERVICE = "192.168.0.57:3306"


def _set_reals(path: Path, settings: dict[str, dict]) -> None:
    doc = json.loads(path.read_text())
    for r in next(s for s in doc["services"] if s["addr"] == SERVICE)["reals"]:
        r.update(settings.get(r["addr"], {}))
    path.write_text(json.dumps(doc))


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    path = tmp_path / "ipvs.json"
    path.write_text(json.dumps(seed_state()))   # the three reals of SERVICE are tunnelled (-i)
    _set_reals(path, {REALS["eu"]: {"tun_type": "gue", "tun_port": 6080, "tun_flags": "+c"},
                      REALS["us"]: {"tun_type": "gre", "tun_flags": "r+c"}})
    return path


def tunnels(path: Path) -> dict[str, tuple[str, int, str]]:
    svc = next(s for s in json.loads(path.read_text())["services"] if s["addr"] == SERVICE)
    return {r["addr"]: (r.get("tun_type", "ipip"), r.get("tun_port", 0), r.get("tun_flags", "-c"))
            for r in svc["reals"]}


def test_apply_and_reconcile_keep_gue_and_gre_tunnels(fake: Path, tmp_path: Path) -> None:
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert weights_in(fake, SERVICE)[REALS["eu"]] == (7000, "Tunnel")
    assert tunnels(fake)[REALS["eu"]] == ("gue", 6080, "+c")
    assert tunnels(fake)[REALS["us"]] == ("gre", 0, "r+c")
    assert tunnels(fake)[REALS["spare"]] == ("ipip", 0, "-c")
    batch = [c["stdin"] for c in calls(fake) if c["argv"] == ["-R"]][-1]
    assert f"-r {REALS['eu']} -i -w 7000 --tun-type gue --tun-port 6080 --tun-csum" in batch
    assert f"-r {REALS['us']} -i -w 3000 --tun-type gre --tun-remcsum" in batch
    assert f"-r {REALS['spare']} -i -w 0\n" in batch   # ipip is the default: no option (older ipvsadm takes it)
    # drift put back by reconcile: the encapsulation stays too
    _set_reals(fake, {REALS["eu"]: {"w": 1}})
    assert act.reconcile().result == "applied"
    assert weights_in(fake, SERVICE)[REALS["eu"]] == (7000, "Tunnel")
    assert tunnels(fake)[REALS["eu"]] == ("gue", 6080, "+c")
    assert tunnels(fake)[REALS["us"]] == ("gre", 0, "r+c")


def test_a_torn_batch_is_undone_with_the_tunnels_kept(fake: Path, tmp_path: Path) -> None:
    """The undo ``-R`` after a failed batch repeats the tunnel options too."""
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    real_run = act.target._run

    def refuse_first_batch(args: list[str], stdin: str | None = None) -> str:
        if args == ["-R"] and len([c for c in calls(fake) if c["argv"] == ["-R"]]) == 0:
            real_run(args, stdin)   # applied (the kernel took it), then the command "fails"
            raise ActuatorError("ipvsadm -R timed out", "unreachable")
        return real_run(args, stdin)

    act.target._run = refuse_first_batch  # type: ignore[method-assign]
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "previous weights restored" in r.reason, r.reason
    assert weights_in(fake, SERVICE)[REALS["eu"]] == (100, "Tunnel")
    assert tunnels(fake)[REALS["eu"]] == ("gue", 6080, "+c")
    assert tunnels(fake)[REALS["us"]] == ("gre", 0, "r+c")


def test_an_ipvsadm_that_cannot_list_tunnels_writes_nothing(fake: Path, tmp_path: Path) -> None:
    """ipvsadm before 1.30 (no ``--tun-info``): it cannot say nor keep a GUE real's settings; failed, nothing
    written (its edit would reset the real to ipip), the error naming the version needed."""
    Path(str(fake) + ".mode").write_text("old")
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "ipvsadm >= 1.30" in r.reason and "--tun-info" in r.reason, r.reason
    assert metrics.ERRORS.labels(act.edge, "command")._value.get() == 1
    assert not [c for c in calls(fake) if c["argv"] == ["-R"]]
    assert tunnels(fake)[REALS["eu"]] == ("gue", 6080, "+c")


@pytest.mark.parametrize("info", ["vxlan", "gue:0:+c", "gue:6080", "gre:x", ""])
def test_tunnel_info_not_understood_writes_nothing(fake: Path, tmp_path: Path, info: str) -> None:
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    real_run = act.target._run

    def garble(args: list[str], stdin: str | None = None) -> str:
        out = real_run(args, stdin)
        if "--tun-info" not in args:
            return out
        return out.replace("gue:6080:+c", info)

    act.target._run = garble  # type: ignore[method-assign]
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "tun-info" in r.reason, r.reason
    assert metrics.ERRORS.labels(act.edge, "parse")._value.get() == 1
    assert not [c for c in calls(fake) if c["argv"] == ["-R"]]


def test_no_tunnelled_real_needs_the_tunnel_listing(tmp_path: Path) -> None:
    """Direct routing / NAT reals: an ipvsadm before 1.30 (``--tun-info`` refused) works as before."""
    path = tmp_path / "ipvs.json"
    state = seed_state()
    for r in next(s for s in state["services"] if s["addr"] == SERVICE)["reals"]:
        r["fwd"] = "Masq"
    path.write_text(json.dumps(state))
    Path(str(path) + ".mode").write_text("old")
    act, _ = lvs_actuator(path, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert weights_in(path, SERVICE)[REALS["eu"]] == (7000, "Masq")


@pytest.mark.parametrize("release,has", [("3.10.0-1160.el7.x86_64", False), ("5.1.21", False), ("5.2.0", True),
                                         ("6.18.44-fc", True), ("unknown", True)])
def test_kernel_has_tunnel_types(release: str, has: bool) -> None:
    assert lvs.kernel_has_tunnel_types(release) is has


def test_an_old_ipvsadm_on_a_kernel_with_ipip_only_applies_to_tunnelled_reals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RHEL 7 (kernel 3.10, ipvsadm 1.27): no ``--tun-info``, but ipip is the only encapsulation there is, so an
    edit resets nothing: applied as before (failing static there would stop every tunnelled site on it)."""
    path = tmp_path / "ipvs.json"
    path.write_text(json.dumps(seed_state()))   # tunnelled reals (-i), ipip
    Path(str(path) + ".mode").write_text("old")
    monkeypatch.setattr(lvs.platform, "release", lambda: "3.10.0-1160.el7.x86_64")
    act, _ = lvs_actuator(path, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3}, edge=act.edge, listener="app"))
    assert r.result == "applied", r.reason
    assert weights_in(path, SERVICE)[REALS["eu"]] == (7000, "Tunnel")


def test_a_tunnelled_real_listed_without_its_tunnel_type_is_not_written(fake: Path, tmp_path: Path) -> None:
    """An ipvsadm that does not know a real's tunnel type (one newer than it) could list it ``Tunnel`` with TunnelInfo
    ``n/a``; read as "not tunnelled" the edit would send no ``--tun-type`` and the kernel would make it ipip."""
    _set_reals(fake, {REALS["us"]: {"tun_type": "unlisted"}})   # the fake lists this type "n/a"
    act, _ = lvs_actuator(fake, tmp_path, f"tcp:{SERVICE}", REALS)
    r = act.apply(decision(1, {"eu": 0.7, "us": 0.3, "spare": 0.0}, edge=act.edge, listener="app"))
    assert r.result == "failed" and "'n/a'" in r.reason, r.reason
    assert not [c for c in calls(fake) if c["argv"] == ["-R"]]
    assert tunnels(fake)[REALS["us"]][0] == "unlisted"
