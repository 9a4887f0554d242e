"""iptables-save parser, reachability analysis, fingerprints, config and port list: unit and fuzz tests."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from opsloop.collectors.iptables import Config
from opsloop.collectors.iptables.analyze import analyze_port
from opsloop.collectors.iptables.fingerprint import fingerprint
from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.collectors.iptables.parse import RulesetParseError, parse_ruleset
from opsloop.collectors.iptables.ports import PortsError, parse_ports
from opsloop.collectors.iptables.versions import parse_versions
from tests.helpers import REPO

TESTDATA = REPO / "collectors" / "iptables" / "testdata"
NFT_SAVE = (TESTDATA / "neutron-2ports.nft-save.txt").read_text()
LEGACY_SAVE_C = (TESTDATA / "neutron-2ports.legacy-save-counters.txt").read_text()
PORT_A = "0695f2ca-bf4e-4a1e-9d6b-2f0a3c1d7e55"
PORT_B = "839737e6-15aa-4c3b-8f3e-7d5b1c2a9f01"
PREFIX = "neutron-openvswi"


def _status(text: str, port: str = PORT_A):
    return analyze_port(parse_ruleset(text), PREFIX, port, f"tap{port[:11]}")


def test_captured_rulesets_parse_with_expected_shape():
    r = parse_ruleset(NFT_SAVE)
    assert set(r.tables) == {"filter"}
    assert r.chain("filter", f"{PREFIX}-i0695f2ca-b") is not None
    assert len(r.chain("filter", f"{PREFIX}-sg-chain").rules) == 5  # 2 jumps per port + ACCEPT
    assert r.rule_count == parse_ruleset(LEGACY_SAVE_C).rule_count


def test_counters_comments_and_backend_text_do_not_change_fingerprint():
    nft, legacy = parse_ruleset(NFT_SAVE), parse_ruleset(LEGACY_SAVE_C)
    assert fingerprint([("x", nft)]) == fingerprint([("x", legacy)])
    recommented = NFT_SAVE.replace("Jump to the VM specific chain.", "something else")
    assert fingerprint([("x", parse_ruleset(recommented))]) == fingerprint([("x", nft)])


def test_rule_change_changes_fingerprint_but_port_set_leaves_base_alone():
    base = parse_ruleset(NFT_SAVE)
    changed = parse_ruleset(NFT_SAVE.replace("--dport 22 -j RETURN", "--dport 2222 -j RETURN", 1))
    assert fingerprint([("nft", changed)]) != fingerprint([("nft", base)])
    other_vms = parse_ruleset(filter_table([LayoutPort("aaaaaaaa-1111-4222-8333-444455556666",
                                                       "10.1.1.1", "fa:16:3e:00:00:01")]))
    assert fingerprint([("nft", other_vms)]) != fingerprint([("nft", base)])
    assert (fingerprint([("nft", other_vms)], PREFIX) == fingerprint([("nft", base)], PREFIX))
    drifted = parse_ruleset(filter_table([], host_rules=("-A INPUT -p tcp -m tcp --dport 2222 -j ACCEPT",)))
    assert fingerprint([("nft", drifted)], PREFIX) != fingerprint([("nft", base)], PREFIX)


def test_all_captured_ports_protected():
    for port in (PORT_A, PORT_B):
        s = _status(NFT_SAVE, port)
        assert s.protected, s.reason
        assert (s.ingress_chain, s.egress_chain, s.spoof_chain, s.ingress_jump, s.egress_jump) == (True,) * 5
    assert _status(NFT_SAVE, PORT_B).ingress_rules == _status(NFT_SAVE, PORT_A).ingress_rules + 1  # :443


def _without(text: str, *needles: str) -> str:
    return "\n".join(line for line in text.splitlines() if not any(n in line for n in needles)) + "\n"


def test_missing_chain_reported():
    text = _without(NFT_SAVE, f"{PREFIX}-i0695f2ca-b")
    s = _status(text)
    assert not s.protected and not s.ingress_chain and "ingress chain" in s.reason
    assert _status(text, PORT_B).protected


def test_missing_jump_reported_with_chain_still_present():
    text = _without(NFT_SAVE, f"--physdev-out tap0695f2ca-bf --physdev-is-bridged -m comment --comment "
                              f"\"Jump to the VM specific chain.\" -j {PREFIX}-i0695f2ca-b")
    s = _status(text)
    assert s.ingress_chain and not s.ingress_jump and not s.protected and "no jump" in s.reason


def test_flushed_ingress_chain_is_not_protected():
    text = _without(NFT_SAVE, f"-A {PREFIX}-i0695f2ca-b ")
    s = _status(text)
    assert s.ingress_jump and s.ingress_rules == 0 and not s.ingress_default_drop and not s.protected


def test_blanket_accept_before_neutron_shadows_every_port():
    text = NFT_SAVE.replace("-A FORWARD -j neutron-filter-top", "-A FORWARD -j ACCEPT\n-A FORWARD -j neutron-filter-top")
    assert not _status(text, PORT_A).protected and not _status(text, PORT_B).protected
    # a conditional ACCEPT for another device does not shadow
    text = NFT_SAVE.replace("-A FORWARD -j neutron-filter-top",
                            "-A FORWARD -m physdev --physdev-out tapffffffff-ff -j ACCEPT\n-A FORWARD -j neutron-filter-top")
    assert _status(text).protected


def test_accept_inside_a_chain_jumped_to_unconditionally_shadows_every_port():
    """An ACCEPT ends the packet's walk wherever it is: one in neutron-filter-top (jumped to from FORWARD
    before neutron-openvswi-FORWARD) or in an operator's chain shadows Neutron as one in FORWARD does."""
    top = NFT_SAVE.replace("-A neutron-filter-top -j neutron-openvswi-local",
                           "-A neutron-filter-top -j ACCEPT\n-A neutron-filter-top -j neutron-openvswi-local")
    assert not _status(top, PORT_A).protected and not _status(top, PORT_B).protected
    assert "no jump" in _status(top).reason
    nested = NFT_SAVE.replace(":neutron-openvswi-local - [0:0]", ":neutron-openvswi-local - [0:0]\n:allow-all - [0:0]")
    nested = nested.replace("-A neutron-filter-top -j neutron-openvswi-local",
                            "-A neutron-filter-top -j neutron-openvswi-local\n-A neutron-openvswi-local -j allow-all\n"
                            "-A allow-all -j LOG\n-A allow-all -j ACCEPT")
    assert not _status(nested).protected   # FORWARD -> top -> local -> allow-all: ACCEPT, two levels down
    goto = NFT_SAVE.replace("-A FORWARD -j neutron-filter-top", "-A FORWARD -g neutron-filter-top")
    assert not _status(goto).protected     # a goto never comes back to FORWARD's later rules
    # Chains that may hand the packet back do not shadow: a conditional ACCEPT, a RETURN before the ACCEPT,
    # an ACCEPT for another device.
    for rules in ("-A neutron-filter-top -p tcp -j ACCEPT", "-A neutron-filter-top -p tcp -j RETURN\n"
                  "-A neutron-filter-top -j ACCEPT", "-A neutron-filter-top -m physdev --physdev-out tapffffffff-ff "
                  "-j RETURN\n-A neutron-filter-top -j ACCEPT"):
        text = NFT_SAVE.replace("-A neutron-filter-top -j neutron-openvswi-local", rules)
        assert _status(text).protected == ("tapffffffff" not in rules), rules


def test_ingress_chain_jumping_to_an_accept_all_chain_does_not_end_in_drop():
    fallback = f"-A {PREFIX}-i0695f2ca-b -j {PREFIX}-sg-fallback"
    text = NFT_SAVE.replace(fallback, f"-A {PREFIX}-i0695f2ca-b -j accept-all\n{fallback}").replace(
        f":{PREFIX}-local - [0:0]", f":{PREFIX}-local - [0:0]\n:accept-all - [0:0]").replace(
        f"-A {PREFIX}-sg-chain -j ACCEPT", f"-A {PREFIX}-sg-chain -j ACCEPT\n-A accept-all -j ACCEPT")
    s = _status(text)
    assert s.ingress_jump and not s.ingress_default_drop and not s.protected and "DROP/REJECT" in s.reason
    assert _status(text, PORT_B).protected


def test_wildcard_negation_goto_and_jump_loops():
    prefix_rules = NFT_SAVE.replace("--physdev-out tap0695f2ca-bf --physdev-is-bridged -m comment --comment "
                                    "\"Jump to the VM specific chain.\"", "--physdev-out tap0695+")
    assert _status(prefix_rules).ingress_jump
    negated = NFT_SAVE.replace("--physdev-out tap0695f2ca-bf --physdev-is-bridged -m comment --comment "
                               "\"Jump to the VM specific chain.\"", "! --physdev-out tap0695f2ca-bf")
    assert not _status(negated).ingress_jump
    goto = NFT_SAVE.replace(f"-j {PREFIX}-i0695f2ca-b", f"-g {PREFIX}-i0695f2ca-b")
    assert _status(goto).protected
    loop = NFT_SAVE.replace("COMMIT", f"-A {PREFIX}-local -j neutron-filter-top\nCOMMIT")
    assert _status(loop).protected  # terminates despite FORWARD -> top -> local -> top


@pytest.mark.parametrize("text, reason", [
    ("*filter\n:INPUT ACCEPT [0:0]\n", "no COMMIT"),
    ("*filter\n-A INPUT -j ACCEPT\nCOMMIT\n", "undeclared chain"),
    ("-A INPUT -j ACCEPT\n", "outside a table"),
    ("*filter\n:INPUT MAYBE [0:0]\nCOMMIT\n", "unknown chain policy"),
    ("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"open -j ACCEPT\nCOMMIT\n", "cannot split"),
    ("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j\nCOMMIT\n", "without a target"),
    ("hello world\n", "not an iptables-save line"),
    ("*filter\nCOMMIT\n*filter\nCOMMIT\n", "appears twice"),
])
def test_bad_input_names_line_and_reason(text, reason):
    with pytest.raises(RulesetParseError, match=reason) as e:
        parse_ruleset(text)
    assert "line " in str(e.value)


_LINES = NFT_SAVE.splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("*:-[]!\"' \n#ACEMNOPTR0123456789abjgmx+")), max_size=400))
def test_fuzz_garbage_never_crashes(text):
    try:
        r = parse_ruleset(text)
    except RulesetParseError:
        return
    analyze_port(r, PREFIX, PORT_A, "tap0695f2ca-bf")
    fingerprint([("nft", r)], PREFIX)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_LINES) - 1), st.sampled_from(["drop", "dup", "cut", "junk"]),
                          st.text(max_size=12)), max_size=6))
def test_fuzz_mutated_real_output_never_crashes(mutations):
    lines = list(_LINES)
    for idx, op, junk in mutations:
        idx %= max(len(lines), 1)
        if not lines:
            break
        if op == "drop":
            del lines[idx]
        elif op == "dup":
            lines.insert(idx, lines[idx])
        elif op == "cut":
            lines[idx] = lines[idx][: len(lines[idx]) // 2]
        else:
            lines[idx] = lines[idx] + junk
    try:
        r = parse_ruleset("\n".join(lines))
    except RulesetParseError as e:
        assert str(e).startswith("line ")
        return
    for port in (PORT_A, PORT_B):
        analyze_port(r, PREFIX, port, f"tap{port[:11]}")


def test_ports_format_and_errors():
    ports = parse_ports(json.dumps([{"port_id": PORT_A, "vm": "web-1", "tenant": "acme", "status": "ACTIVE"}]), "f")
    assert ports[0].device == "tap0695f2ca-bf" and ports[0].tenant == "acme"
    yaml_ports = parse_ports(f"ports:\n  - {{port_id: {PORT_B}, vm: db-1, device: tapcustom}}\n", "f")
    assert yaml_ports[0].device == "tapcustom"
    with pytest.raises(PortsError, match=r"ports\.0\.vm"):
        parse_ports(json.dumps([{"port_id": PORT_A}]), "f")
    with pytest.raises(PortsError, match="listed twice"):
        parse_ports(json.dumps([{"port_id": PORT_A, "vm": "a"}] * 2), "f")
    with pytest.raises(PortsError, match="expected a list"):
        parse_ports('"just a string"', "f")
    with pytest.raises(PortsError, match="not valid YAML"):
        parse_ports("[{", "f")


def test_versions_parsing():
    text = "iptables\t1.8.9-2\tii \nneutron-openvswitch-agent\t2:21.1.0-0ubuntu1\trc \nlibfoo:amd64\t1\tii \n"
    assert parse_versions(text, ["iptables", "neutron-openvswitch-agent", "python3-neutron"]) == {
        "iptables": "1.8.9-2", "neutron-openvswitch-agent": "unknown", "python3-neutron": "unknown"}
    assert parse_versions("iptables 1.8.7\n", ["iptables"]) == {"iptables": "1.8.7"}


def test_config_validation_names_the_field(tmp_path):
    with pytest.raises(ValidationError, match="backend"):
        Config(backend="iptables", ports_file=tmp_path / "p.json")
    with pytest.raises(ValidationError, match="ports_file or ports_command"):
        Config(targets=[{"host": "hv1"}])
    with pytest.raises(ValidationError, match="appears more than once"):
        Config(ports_file=tmp_path / "p", targets=[{"host": "hv1"}, {"host": "hv1"}])
    with pytest.raises(ValidationError, match="netns"):
        Config(ports_file=tmp_path / "p", targets=[{"host": "hv1", "netns": "bad name; rm"}])
    with pytest.raises(ValidationError, match="extra"):
        Config(ports_file=tmp_path / "p", unknown_option=1)
    cfg = Config(ports_command=["cat", "x"], targets=[{"host": "hv1"}, {"host": "hv2", "ports_file": "f.json"}])
    assert cfg.targets[0].ports_command == ["cat", "x"] and cfg.targets[1].ports_command is None
