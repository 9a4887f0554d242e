"""The Telegraf build (setup.d/60-telegraf.sh) and opsloop's sample configs, run by the real Telegraf.

Each sample config is checked by Telegraf itself, then gathered once where its input can run here:
HAProxy (the lab edge's admin socket) and iptables (Neutron-shaped rules in a network namespace).
Every record must pass opsloop's wire parser and route to the topic our own collectors use.
IPVS cannot run on this kernel (no ip_vs): its config is checked, and the gather shown to be empty.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.haproxy_api import HaproxyAPI
from opsloop.wire import Topic
from tests.collectors.telegraf_lab import (CONFIG_DIR, SETUP_SCRIPT, TELEGRAF, VERSION, ensure_telegraf,
                                           parse_all, run_once, run_telegraf, sample_config)

pytestmark = pytest.mark.integration

SAMPLES = ("haproxy", "ipmi", "iptables", "ipvs")
TOPIC_OF_SAMPLE = {"haproxy": Topic.LB, "ipmi": Topic.IPMI, "iptables": Topic.IPTABLES, "ipvs": Topic.LB}


@pytest.fixture(scope="module", autouse=True)
def telegraf_binary() -> Path:
    return ensure_telegraf()


def test_cached_binary_is_the_pinned_version_with_only_our_plugins() -> None:
    res = subprocess.run([str(TELEGRAF), "--version"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().split()[:2] == ["Telegraf", VERSION], res.stdout
    listed = subprocess.run([str(TELEGRAF), "plugins", "inputs"], capture_output=True, text=True, timeout=30)
    assert set(listed.stdout.split()) == {"inputs.haproxy", "inputs.ipmi_sensor", "inputs.iptables", "inputs.ipvs"}


def test_second_setup_run_is_a_no_op() -> None:
    before = TELEGRAF.stat().st_mtime_ns
    res = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "up to date" in res.stdout
    assert TELEGRAF.stat().st_mtime_ns == before


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_config_passes_telegrafs_own_check(name: str) -> None:
    res = run_telegraf([sample_config(name)], {}, command=("config", "check"))
    assert res.returncode == 0, res.stderr[-1500:]


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_config_routes_by_tag_and_writes_seconds(name: str) -> None:
    """outputs.kafka: topic from the opsloop_topic tag (set on the input), JSON with 1 s timestamps."""
    text = sample_config(name).read_text()
    assert f'opsloop_topic = "{TOPIC_OF_SAMPLE[name].value}"' in text
    assert 'topic_tag = "opsloop_topic"' in text
    assert 'data_format = "json"' in text and 'json_timestamp_units = "1s"' in text


def test_a_misspelt_option_is_reported_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text(sample_config("haproxy").read_text().replace("keep_field_names", "keep_field_namez"))
    res = run_telegraf([bad], {}, command=("config", "check"))
    assert res.returncode != 0
    assert "keep_field_namez" in res.stderr


def test_haproxy_sample_gathers_the_lab_edge_in_our_collectors_shape(lab_edge, tmp_path: Path) -> None:
    lab_edge.start()
    HaproxyAPI(lab_edge.admin_socket).set_weight("be_web", "near", 37)
    lb = f"edge-{uuid.uuid4().hex[:6]}"
    env = {"OPSLOOP_HAPROXY_SOCKET": str(lab_edge.admin_socket), "OPSLOOP_LB_NAME": lb}
    records, res = run_once(sample_config("haproxy"), env, tmp_path)
    assert res.returncode == 0, res.stderr[-1500:]
    metrics = parse_all(records)
    rows = {(m.tags["type"], m.tags["proxy"], m.tags["sv"]): m for m in metrics}
    assert set(rows) >= {("frontend", "fe_web", "FRONTEND"), ("backend", "be_web", "BACKEND"),
                         ("server", "be_web", "near"), ("server", "be_web", "far")}
    for m in metrics:
        assert m.name == "haproxy" and m.tags["host"] == lb
        assert m.topic is Topic.LB and m.key == lb
        # The processor renamed Telegraf's http_response.2xx back to HAProxy's hrsp_2xx.
        assert "hrsp_2xx" in m.fields and not any(f.startswith("http_response") for f in m.fields)
    near = rows[("server", "be_web", "near")]
    assert near.fields["weight"] == 37 and rows[("server", "be_web", "far")].fields["weight"] == 100
    assert str(near.fields["status"]).startswith("UP")


# --- iptables: a Neutron-shaped "hypervisor" in a network namespace ---------------------------------------


@pytest.fixture
def hypervisor_ns() -> Iterator[str]:
    ns = f"tg-hv-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
    try:
        yield ns
    finally:
        subprocess.run(["ip", "netns", "delete", ns], timeout=10)


PORTS = [LayoutPort("7f1c2a3b-1111-4c5d-8e9f-000000000001", "10.0.0.11", "fa:16:3e:00:00:01"),
         LayoutPort("7f1c2a3b-2222-4c5d-8e9f-000000000002", "10.0.0.12", "fa:16:3e:00:00:02")]
JUMP_COMMENT = "Jump to the VM specific chain."


def _restore(ns: str, ruleset: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "iptables-restore"], input=ruleset, text=True, check=True, timeout=10)


def test_iptables_sample_reads_neutron_chains_but_merges_ports(hypervisor_ns: str, tmp_path: Path) -> None:
    _restore(hypervisor_ns, filter_table(PORTS))
    env = {"OPSLOOP_HYPERVISOR": "hv-17"}
    prefix = ["ip", "netns", "exec", hypervisor_ns]
    records, res = run_once(sample_config("iptables"), env, tmp_path, prefix=prefix)
    assert res.returncode == 0, res.stderr[-1500:]
    metrics = parse_all(records)
    assert metrics and all(m.name == "iptables" and m.topic is Topic.IPTABLES and m.key == "hv-17" for m in metrics)
    jumps = [m for m in metrics if m.tags["chain"] == "neutron-openvswi-sg-chain"]
    # One record per commented rule: two jumps per port, all with Neutron's one shared comment.
    assert len(jumps) == 2 * len(PORTS)
    assert {m.tags["ruleid"] for m in jumps} == {JUMP_COMMENT}
    assert {tuple(sorted(m.fields)) for m in jumps} == {("bytes", "pkts")}

    # Drop the first VM's jumps: Telegraf sees fewer rules, but nothing says which port lost them.
    first = PORTS[0]
    remaining = filter_table(PORTS).splitlines()
    remaining = [line for line in remaining if not (line.startswith("-A neutron-openvswi-sg-chain")
                                                    and f"tap{first.port_id[:11]}" in line)]
    _restore(hypervisor_ns, "\n".join(remaining) + "\n")
    records, res = run_once(sample_config("iptables"), env, tmp_path, prefix=prefix)
    assert res.returncode == 0, res.stderr[-1500:]
    jumps_after = [m for m in parse_all(records) if m.tags["chain"] == "neutron-openvswi-sg-chain"]
    assert len(jumps_after) == 2 * (len(PORTS) - 1)
    assert {tuple(sorted(m.tags.items())) for m in jumps_after} == {tuple(sorted(m.tags.items())) for m in jumps}


def test_iptables_sample_without_neutron_chains_reports_an_error_not_silence(hypervisor_ns: str,
                                                                               tmp_path: Path) -> None:
    records, res = run_once(sample_config("iptables"), {}, tmp_path, prefix=["ip", "netns", "exec", hypervisor_ns])
    assert records == []
    assert res.returncode != 0
    assert "inputs.iptables" in res.stderr


def test_ipvs_sample_on_a_kernel_without_ipvs_gathers_nothing(tmp_path: Path) -> None:
    """No ip_vs here: Telegraf's input finds no services and says nothing (README: alert on absent data)."""
    assert not Path("/proc/net/ip_vs").exists()
    records, res = run_once(sample_config("ipvs"), {"OPSLOOP_EDGE_NAME": "edge-ams-1"}, tmp_path)
    assert res.returncode == 0, res.stderr[-1500:]
    assert records == []


def test_every_sample_config_is_documented_in_the_readme() -> None:
    readme = (CONFIG_DIR / "README.md").read_text()
    for name in SAMPLES:
        assert f"telegraf-{name}.conf" in readme
