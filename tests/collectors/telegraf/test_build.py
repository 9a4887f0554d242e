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

from opsloop.collectors.iptables.neutron_layout import LayoutPort, filter_table
from opsloop.lb.haproxy import HaproxyAPI
from opsloop.topics import Topic
from opsloop.wire import parse_record
from tests.helpers import read_topic, wait_until
from tests.collectors.telegraf.lab import (AGENT_CONFIG, CONFIG_DIR, SETUP_SCRIPT, SNIPPET_DIR, TELEGRAF, VERSION,
                                           ensure_telegraf, parse_all, run_once, run_telegraf, sample_config)

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
    """The snippet tags its input with its topic; the one agent file routes by that tag, JSON in seconds."""
    text = sample_config(name).read_text()
    assert f'opsloop_topic = "{TOPIC_OF_SAMPLE[name].value}"' in text
    tables = [line.strip() for line in text.splitlines() if line.startswith("[")]
    assert "[agent]" not in tables and not any(x.startswith("[[outputs.") for x in tables), "a snippet must not carry an agent or output"
    agent = AGENT_CONFIG.read_text()
    assert agent.splitlines().count("[[outputs.kafka]]") == 1 and 'topic_tag = "opsloop_topic"' in agent
    assert 'data_format = "json"' in agent and 'json_timestamp_units = "1s"' in agent


def test_the_agent_with_every_snippet_passes_telegrafs_own_check() -> None:
    """What operators run: the agent file plus the whole snippet directory."""
    res = run_telegraf([SNIPPET_DIR], {}, command=("config", "check"))
    assert res.returncode == 0, res.stderr[-1500:]
    assert sorted(p.stem for p in SNIPPET_DIR.glob("*.conf")) == sorted(SAMPLES)


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
    env = {"OPSLOOP_HAPROXY_SOCKET": str(lab_edge.admin_socket), "OPSLOOP_HOST_NAME": lb}
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


def test_agent_with_every_snippet_sends_each_record_once_to_kafka(stack, lab_edge, tmp_path: Path) -> None:
    """The production invocation (agent file + the whole telegraf.d) against the real broker: each HAProxy
    row reaches telemetry.lb once. Two snippets each carrying an [[outputs.kafka]] sent every metric twice.
    The other inputs (in-band IPMI, host iptables, IPVS) have nothing to read here and report errors."""
    lab_edge.start()
    lb = f"edge-multi-{uuid.uuid4().hex[:6]}"
    env = {"OPSLOOP_KAFKA_BROKERS": stack.kafka_bootstrap, "OPSLOOP_HAPROXY_SOCKET": str(lab_edge.admin_socket),
           "OPSLOOP_HOST_NAME": lb, "OPSLOOP_NEUTRON_PREFIX": f"absent-{lb}"}
    res = run_telegraf([SNIPPET_DIR], env, "--once", timeout=120)
    assert "Loaded inputs: haproxy ipmi_sensor iptables ipvs\n" in res.stderr, res.stderr[-1500:]
    assert "Loaded outputs: kafka\n" in res.stderr, res.stderr[-1500:]     # one output, however many snippets
    rows: dict[tuple[str, str, str, float], int] = {}

    def arrived() -> bool:
        rows.clear()
        for rec in read_topic(stack.kafka_bootstrap, Topic.LB.value, timeout_s=20):
            for m in parse_record(rec.value).metrics:
                if m.tags.get("host") == lb:
                    k = (m.tags["type"], m.tags["proxy"], m.tags["sv"], m.timestamp)
                    rows[k] = rows.get(k, 0) + 1
        return len({k[:3] for k in rows}) >= 4
    wait_until(arrived, timeout=60, what=f"HAProxy rows of {lb} on telemetry.lb")
    assert set(rows.values()) == {1}, {k: n for k, n in rows.items() if n != 1}
    assert {("server", "be_web", "near"), ("server", "be_web", "far")} <= {k[:3] for k in rows}


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
    env = {"OPSLOOP_HOST_NAME": "hv-17"}
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
    records, res = run_once(sample_config("ipvs"), {"OPSLOOP_HOST_NAME": "edge-ams-1"}, tmp_path)
    assert res.returncode == 0, res.stderr[-1500:]
    assert records == []


def test_every_sample_config_is_documented_in_the_readme() -> None:
    readme = (CONFIG_DIR / "README.md").read_text()
    for name in SAMPLES:
        assert f"telegraf.d/{name}.conf" in readme
