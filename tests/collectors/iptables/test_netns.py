"""iptables collector against real rulesets: "hypervisors" are network namespaces with tap devices
and Neutron-shaped rules restored with the real iptables-nft-restore / iptables-legacy-restore."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsloop.collect import tool as tool_module
from opsloop.collect.tool import ToolResult
from opsloop.collectors.iptables import Config, build
from opsloop.collectors.iptables.collector import tool_not_executable, tool_not_found
from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.collect.types import Round
from tests.helpers import REPO

pytestmark = pytest.mark.integration
PREFIX = "neutron-openvswi"


def _sh(*argv: str, stdin: str | None = None) -> str:
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"{argv} failed: {res.stderr}")
    return res.stdout


@dataclass
class Hypervisor:
    host: str
    netns: str
    backend: str
    ports: list[LayoutPort]
    ports_file: Path

    def ipt(self, *args: str) -> str:
        return _sh("ip", "netns", "exec", self.netns, f"iptables-{self.backend}", *args)

    def save(self) -> str:
        return _sh("ip", "netns", "exec", self.netns, f"iptables-{self.backend}-save")

    def restore(self, text: str) -> None:
        _sh("ip", "netns", "exec", self.netns, f"iptables-{self.backend}-restore", stdin=text)

    def save6(self) -> str:
        return _sh("ip", "netns", "exec", self.netns, f"ip6tables-{self.backend}-save")

    def restore6(self, text: str) -> None:
        _sh("ip", "netns", "exec", self.netns, f"ip6tables-{self.backend}-restore", stdin=text)

    def target(self) -> dict:
        return {"host": self.host, "netns": self.netns, "ports_file": str(self.ports_file)}


@pytest.fixture
def hypervisors(tmp_path):
    """Factory: make_hv(host, n_ports, backend) builds one namespace; all are deleted afterwards."""
    created: list[str] = []

    def make_hv(host: str, n_ports: int = 2, backend: str = "nft") -> Hypervisor:
        netns = f"opsl-fw-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        _sh("ip", "netns", "add", netns)
        created.append(netns)
        ports = []
        for i in range(n_ports):
            pid = str(uuid.uuid4())
            ports.append(LayoutPort(pid, f"10.0.{len(created)}.{i + 10}", f"fa:16:3e:00:{len(created):02x}:{i:02x}"))
            _sh("ip", "netns", "exec", netns, "ip", "tuntap", "add", "dev", f"tap{pid[:11]}", "mode", "tap")
        hv = Hypervisor(host, netns, backend, ports, tmp_path / f"{host}-ports.json")
        hv.ports_file.write_text(json.dumps([{"port_id": p.port_id, "vm": f"{host}-vm{i}", "tenant": "acme"}
                                             for i, p in enumerate(ports)]))
        hv.restore(filter_table(ports))
        hv.restore6(filter_table(ports, family="ipv6"))   # Neutron programs both families
        return hv

    yield make_hv
    for netns in created:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def _collect(*hvs: Hypervisor, **extra) -> Round:
    cfg = Config.model_validate({"targets": [hv.target() for hv in hvs], **extra})
    return build(cfg).collect()


def _ports(rnd: Round) -> dict[str, dict]:
    return {m.tags["port_id"]: {**m.fields, **m.tags} for m in rnd.metrics if m.name == "iptables_vm_port"}


def _rulesets(rnd: Round) -> dict[str, dict]:
    return {m.tags["host"]: dict(m.fields) for m in rnd.metrics if m.name == "iptables_ruleset"}


def test_all_ports_on_all_hypervisors_protected(hypervisors):
    hvs = [hypervisors("hv1"), hypervisors("hv2"), hypervisors("hv3", n_ports=3, backend="legacy")]
    rnd = _collect(*hvs)
    assert rnd.errors == []
    ports = _ports(rnd)
    assert len(ports) == 7
    for hv in hvs:
        for i, p in enumerate(hv.ports):
            got = ports[p.port_id]
            assert got["protected"] == 1, got
            assert (got["host"], got["vm"], got["device"], got["backend"]) == (hv.host, f"{hv.host}-vm{i}",
                                                                               f"tap{p.port_id[:11]}", hv.backend)
    rs = _rulesets(rnd)
    assert {h: r["ports_protected"] for h, r in rs.items()} == {"hv1": 2, "hv2": 2, "hv3": 3}
    assert all(r["ports_unprotected"] == 0 for r in rs.values())
    # Same software and config, different VMs: base fingerprints agree, full ones do not.
    assert rs["hv1"]["base_fingerprint"] == rs["hv2"]["base_fingerprint"]
    assert rs["hv1"]["fingerprint"] != rs["hv2"]["fingerprint"]
    assert rs["hv3"]["backend"] == "legacy" and rs["hv1"]["backend"] == "nft"
    # every sample's first tag is the host (the Kafka key)
    assert all(next(iter(m.tags)) == "host" for m in rnd.metrics)


def test_deleted_chains_make_that_vm_unprotected_next_round(hypervisors):
    hv1, hv2 = hypervisors("hv1"), hypervisors("hv2")
    assert all(p["protected"] == 1 for p in _ports(_collect(hv1, hv2)).values())

    # The incident: the agent drops one VM's security-group chains and every rule that names them.
    victim = hv2.ports[0].port_id
    short, tap = victim[:10], f"tap{victim[:11]}"
    kept = [line for line in hv2.save().splitlines() if short not in line and tap not in line]
    hv2.restore("\n".join(kept) + "\n")
    assert f"-i{short}" not in hv2.save()

    ports = _ports(_collect(hv1, hv2))
    assert ports[victim]["protected"] == 0
    assert ports[victim]["ingress_chain"] == 0 and "missing" in ports[victim]["reason"]
    assert [pid for pid, p in ports.items() if p["protected"] == 0] == [victim]


def test_deleted_jump_only_makes_vm_unprotected(hypervisors):
    hv = hypervisors("hv1")
    victim = hv.ports[1].port_id
    tap, chain = f"tap{victim[:11]}", f"{PREFIX}-i{victim[:10]}"
    hv.ipt("-D", f"{PREFIX}-sg-chain", "-m", "physdev", "--physdev-out", tap, "--physdev-is-bridged",
           "-m", "comment", "--comment", "Jump to the VM specific chain.", "-j", chain)
    rnd = _collect(hv)
    got = _ports(rnd)[victim]
    assert (got["protected"], got["ingress_chain"], got["ingress_jump"], got["egress_jump"]) == (0, 1, 0, 1)
    assert chain in got["reason"]
    assert _ports(rnd)[hv.ports[0].port_id]["protected"] == 1
    assert _rulesets(rnd)["hv1"]["ports_unprotected"] == 1


def test_blanket_accept_shadows_every_port(hypervisors):
    hv = hypervisors("hv1")
    hv.ipt("-I", "FORWARD", "1", "-j", "ACCEPT")
    assert [p["protected"] for p in _ports(_collect(hv)).values()] == [0, 0]


def test_accept_in_neutron_filter_top_shadows_every_port(hypervisors):
    """An ACCEPT in a chain FORWARD jumps to first ends the walk there: Neutron's chains, all present, are
    never reached (the kernel accepts at neutron-filter-top)."""
    hv = hypervisors("hv1", backend="legacy")
    assert [p["protected"] for p in _ports(_collect(hv, families=["ipv4"])).values()] == [1, 1]
    hv.ipt("-I", "neutron-filter-top", "1", "-j", "ACCEPT")
    ports = _ports(_collect(hv, families=["ipv4"]))
    assert [(p["protected"], p["ingress_chain"], p["ingress_jump"]) for p in ports.values()] == [(0, 1, 0)] * 2
    assert all("no jump" in p["reason"] for p in ports.values())


def test_rule_drift_changes_that_hosts_fingerprints_only(hypervisors):
    hv1, hv2 = hypervisors("hv1"), hypervisors("hv2")
    before = _rulesets(_collect(hv1, hv2))
    hv2.ipt("-A", "INPUT", "-p", "tcp", "--dport", "2222", "-j", "ACCEPT")
    after = _rulesets(_collect(hv1, hv2))
    assert after["hv1"] == before["hv1"]
    assert after["hv2"]["fingerprint"] != before["hv2"]["fingerprint"]
    assert after["hv2"]["base_fingerprint"] != after["hv1"]["base_fingerprint"]
    assert after["hv2"]["rules"] == before["hv2"]["rules"] + 1


def test_package_versions_default_and_per_host_command(hypervisors):
    hv1, hv2 = hypervisors("hv1"), hypervisors("hv2")
    real = _sh("dpkg-query", "-W", "-f", "${Version}", "iptables")
    t2 = {**hv2.target(), "versions_command": ["printf", "iptables\t1.6.0-2ubuntu3\tii \n"]}
    cfg = Config.model_validate({"targets": [hv1.target(), t2], "packages": ["iptables", "neutron-openvswitch-agent"]})
    rnd = build(cfg).collect()
    versions = {(m.tags["host"], m.tags["package"]): m.fields["version"] for m in rnd.metrics
                if m.name == "iptables_software"}
    assert versions == {("hv1", "iptables"): real, ("hv1", "neutron-openvswitch-agent"): "unknown",
                        ("hv2", "iptables"): "1.6.0-2ubuntu3", ("hv2", "neutron-openvswitch-agent"): "unknown"}


def test_ports_from_command_and_bad_ports_file(hypervisors, tmp_path):
    hv1, hv2 = hypervisors("hv1"), hypervisors("hv2")
    t1 = {"host": "hv1", "netns": hv1.netns, "ports_command": ["cat", str(hv1.ports_file)]}
    hv2.ports_file.write_text(json.dumps([{"port_id": "not-a-uuid!", "vm": "x"}]))
    rnd = _collect_cfg({"targets": [t1, hv2.target()]})
    assert len(_ports(rnd)) == 2 and all(p["host"] == "hv1" for p in _ports(rnd).values())
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv2", "parse")]
    assert "port_id" in rnd.errors[0].message


def _collect_cfg(doc: dict) -> Round:
    return build(Config.model_validate(doc)).collect()


def test_missing_namespace_is_unreachable_and_others_still_report(hypervisors, tmp_path):
    hv = hypervisors("hv1")
    gone = {"host": "hv-gone", "netns": f"opsl-fw-missing-{uuid.uuid4().hex[:6]}", "ports_file": str(hv.ports_file)}
    rnd = _collect_cfg({"targets": [hv.target(), gone]})
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv-gone", "unreachable")]
    assert {p["host"] for p in _ports(rnd).values()} == {"hv1"}


def test_permission_denied_from_iptables_save_is_an_error_not_all_fine(hypervisors):
    hv = hypervisors("hv1", backend="legacy")
    # The prefix drops the capabilities, so the real iptables-save is refused by the kernel.
    rnd = _collect_cfg({"targets": [hv.target()],
                        "command_prefix": ["setpriv", "--bounding-set", "-net_admin,-net_raw"]})
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "permission")]
    assert "Permission denied" in rnd.errors[0].message
    assert not [m for m in rnd.metrics if m.name in ("iptables_vm_port", "iptables_ruleset")]


def test_without_capabilities_collect_raises_unavailable(hypervisors):
    hv = hypervisors("hv1")
    script = textwrap.dedent(f"""
        from opsloop.collectors.iptables import Config, build
        from opsloop.collect.types import CollectorUnavailable
        try:
            build(Config.model_validate({{"targets": [{hv.target()!r}]}})).collect()
        except CollectorUnavailable as e:
            print("UNAVAILABLE:", e)
        else:
            print("COLLECTED")
    """)
    res = subprocess.run(["setpriv", "--bounding-set", "-net_admin,-net_raw", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert res.stdout.startswith("UNAVAILABLE:"), res.stdout + res.stderr
    assert "CAP_NET_ADMIN" in res.stdout and "CAP_NET_RAW" in res.stdout


def test_hung_ports_command_is_killed_with_its_children(hypervisors, tmp_path):
    hv = hypervisors("hv1")
    pidfile = tmp_path / "grandchild.pid"
    hang = ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"]
    rnd = _collect_cfg({"timeout_s": 1, "targets": [{"host": "hv1", "netns": hv.netns, "ports_command": hang}]})
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "timeout")]
    pid = int(pidfile.read_text())
    assert _gone_or_zombie(pid)


def _gone_or_zombie(pid: int) -> bool:
    import time
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False



def test_a_port_open_over_ipv6_only_is_unprotected(hypervisors):
    """IPv6 traffic never meets iptables' rules: chains gone from ip6tables alone expose the VM."""
    hv = hypervisors("hv6")
    ports = _ports(_collect(hv))
    assert all(p["protected"] == 1 and p["protected_ipv4"] == 1 and p["protected_ipv6"] == 1 for p in ports.values())

    victim = hv.ports[0].port_id
    short, tap = victim[:10], f"tap{victim[:11]}"
    kept = [line for line in hv.save6().splitlines() if short not in line and tap not in line]
    hv.restore6("\n".join(kept) + "\n")
    assert short in hv.save()          # IPv4 untouched

    rnd = _collect(hv)
    assert rnd.errors == []
    got = _ports(rnd)[victim]
    assert got["protected"] == 0 and got["protected_ipv4"] == 1 and got["protected_ipv6"] == 0
    assert got["family"] == "ipv6" and got["reason"].startswith("ipv6: ingress chain")
    assert _ports(rnd)[hv.ports[1].port_id]["protected"] == 1
    assert _rulesets(rnd)["hv6"]["ports_unprotected"] == 1
    assert _rulesets(rnd)["hv6"]["families"] == "ipv4+ipv6"
    # A hypervisor with IPv6 disabled is configured to read IPv4 only.
    only4 = _ports(_collect(hv, families=["ipv4"]))[victim]
    assert only4["protected"] == 1 and "protected_ipv6" not in only4


def test_recorded_ip6tables_nft_save_is_read_as_protected():
    """Output recorded from the real ip6tables-nft-save 1.8.9 after restoring the IPv6 layout."""
    from opsloop.collectors.iptables.analyze import analyze_port
    from opsloop.collectors.iptables.parse import parse_ruleset

    text = (REPO / "collectors/iptables/testdata/neutron-1port.ip6tables-nft-save.txt").read_text()
    status = analyze_port(parse_ruleset(text), PREFIX, "aaaaaaaa-1111-4222-8333-444455556666", "tapaaaaaaaa-11")
    assert status.protected and status.spoof_rules == 3


def _nft_only_host(bindir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools' PATH holds iptables-nft only (no *-legacy-save), as on a RHEL 9 / nft-only Debian hypervisor."""
    bindir.mkdir()
    for tool in ("iptables-nft-save", "ip6tables-nft-save"):
        (bindir / tool).symlink_to("/usr/sbin/xtables-nft-multi")
    for tool in ("ip", "env"):
        (bindir / tool).symlink_to(shutil.which(tool))
    monkeypatch.setitem(tool_module._ENV, "PATH", str(bindir))


@pytest.mark.parametrize("prefix", [[], ["env"]], ids=["netns", "netns+prefix"])
def test_auto_backend_on_an_nft_only_host_behind_a_wrapper(hypervisors, tmp_path, monkeypatch, prefix):
    hv = hypervisors("hv1")   # rules in nft
    _nft_only_host(tmp_path / "bin", monkeypatch)
    # `ip netns exec` / `env` report the missing iptables-legacy-save with an exit status: before, that
    # failed the whole target (kind tool) on every nft-only hypervisor run in a netns or behind sudo
    rnd = _collect(hv, command_prefix=prefix)
    assert rnd.errors == []
    assert [p["protected"] for p in _ports(rnd).values()] == [1, 1]
    assert _rulesets(rnd)["hv1"]["backend"] == "nft"
    # asked for by name, a missing backend is still an error
    rnd = _collect(hv, command_prefix=prefix, backend="legacy")
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")]
    assert "iptables-legacy-save" in rnd.errors[0].message


def test_auto_backend_on_an_nft_only_host_behind_a_prefix_alone(hypervisors, tmp_path, monkeypatch):
    hv = hypervisors("hv1")
    _nft_only_host(tmp_path / "bin", monkeypatch)
    # no netns: the prefix itself says "env: 'iptables-legacy-save': No such file or directory" (exit 127);
    # the host's own ruleset is read (its ports are not ours: only the round's success is checked)
    rnd = _collect_cfg({"targets": [{"host": "hv1", "ports_file": str(hv.ports_file)}], "command_prefix": ["env"]})
    assert rnd.errors == [] and _rulesets(rnd)["hv1"]["backend"] == "nft"


def test_nothing_installed_behind_a_wrapper_is_one_tool_error(hypervisors, tmp_path, monkeypatch):
    hv = hypervisors("hv1")
    _nft_only_host(tmp_path / "bin", monkeypatch)
    for tool in ("iptables-nft-save", "ip6tables-nft-save"):
        (tmp_path / "bin" / tool).unlink()
    rnd = _collect(hv, command_prefix=["env"])
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")]
    assert "neither iptables-legacy-save nor iptables-nft-save could be run" in rnd.errors[0].message


def test_missing_wrapper_or_oversized_output_is_no_absent_backend(hypervisors, monkeypatch):
    hv = hypervisors("hv1")   # rules in nft only: legacy's save prints an empty ruleset
    rnd = _collect(hv, command_prefix=["opsl-no-such-sudo"])
    # before: both backends skipped as "not installed", the error said to install the iptables package
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")]
    assert "cannot run 'opsl-no-such-sudo'" in rnd.errors[0].message
    # nft's save killed past the output bound: before, skipped like an absent backend, and legacy's empty
    # ruleset read as every port's chains gone, with no error
    monkeypatch.setattr(tool_module, "MAX_OUTPUT_BYTES", 4096)
    rnd = _collect(hv)
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")]
    assert "iptables-nft-save" in rnd.errors[0].message and "printed more than 4096 bytes" in rnd.errors[0].message
    assert not [m for m in rnd.metrics if m.name in ("iptables_vm_port", "iptables_ruleset")]


@pytest.mark.parametrize("prefix", [[], ["env"]], ids=["netns", "netns+prefix"])
def test_a_non_executable_save_tool_in_a_netns_is_a_tool_error_not_permission(hypervisors, tmp_path, monkeypatch,
                                                                               prefix):
    hv = hypervisors("hv1")
    _nft_only_host(tmp_path / "bin", monkeypatch)
    save = tmp_path / "bin" / "iptables-nft-save"
    save.unlink()
    save.write_text("#!/bin/sh\nexec /usr/sbin/xtables-nft-multi iptables-save \"$@\"\n")
    save.chmod(0o644)   # installed without its x bit: `ip netns exec` says "exec of ... failed: Permission denied"
    rnd = _collect(hv, command_prefix=prefix, backend="nft", families=["ipv4"])
    # before: kind "permission", the message telling the operator to grant root/CAP_NET_ADMIN
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")], rnd.errors
    assert "iptables-nft-save is not executable" in rnd.errors[0].message
    assert "Permission denied" in rnd.errors[0].message and "CAP_NET_ADMIN" not in rnd.errors[0].message
    assert not [m for m in rnd.metrics if m.name in ("iptables_vm_port", "iptables_ruleset")]
    save.chmod(0o755)   # the same file, executable: read as usual
    rnd = _collect(hv, command_prefix=prefix, backend="nft", families=["ipv4"])
    assert rnd.errors == [] and [p["protected"] for p in _ports(rnd).values()] == [1, 1]


@pytest.mark.parametrize("stderr, denied", [
    ('exec of "iptables-legacy-save" failed: Permission denied\n', True),             # ip netns exec
    ("env: 'iptables-legacy-save': Permission denied\n", True),                       # env, LC_ALL=C
    ("env: \u2018iptables-legacy-save\u2019: Permission denied\n", True),             # env, UTF-8 locale
    ("nsenter: failed to execute iptables-legacy-save: Permission denied\n", True),
    ("sh: 1: iptables-legacy-save: Permission denied\n", True),
    # the tool's own refusal, the namespace's, another command's: a privilege problem, not the tool's mode
    ("iptables-legacy-save v1.8.9 (legacy): Cannot initialize: Permission denied (you must be root)\n", False),
    ('setting the network namespace "x" failed: Operation not permitted\n', False),
    ("mount --make-rslave /: Permission denied\n", False),
    ("env: 'ip': Permission denied\n", False),
    ('exec of "ip6tables-legacy-save" failed: Permission denied\n', False),
])
def test_tool_not_executable_reads_the_wrappers_words(stderr: str, denied: bool) -> None:
    assert tool_not_executable(ToolResult(("x",), 126, "", stderr), "iptables-legacy-save") is denied
    assert not tool_not_executable(ToolResult(("x",), 0, "", stderr), "iptables-legacy-save")


@pytest.mark.parametrize("stderr, missing", [
    ('exec of "iptables-legacy-save" failed: No such file or directory\n', True),   # ip netns exec
    ("env: 'iptables-legacy-save': No such file or directory\n", True),             # env
    ("sudo: iptables-legacy-save: command not found\n", True),                     # sudo
    ("sh: 1: iptables-legacy-save: not found\n", True),                            # a shell
    ("nsenter: failed to execute iptables-legacy-save: No such file or directory\n", True),
    # the wrapper's own or another command's failure, the tool's own errors: not "tool missing"
    ("env: 'ip': No such file or directory\n", False),
    ('Cannot open network namespace "x": No such file or directory\n', False),
    ("iptables-save v1.8.9 (legacy): Cannot initialize: Table does not exist\n", False),
    ("sudo: a password is required\n", False),
    ("ip6tables-legacy-save: command not found\n", False),
])
def test_tool_not_found_reads_the_wrappers_words(stderr: str, missing: bool) -> None:
    res = ToolResult(("x",), 127, "", stderr)
    assert tool_not_found(res, "iptables-legacy-save") is missing
    assert not tool_not_found(ToolResult(("x",), 0, "", stderr), "iptables-legacy-save")
