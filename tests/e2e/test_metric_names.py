"""Metric names follow the Prometheus naming conventions: base units, ``_total`` counters, promtool clean.

* Every metric the code defines is found by parsing the source (calls of prometheus_client's metric
  classes and of custom collectors' ``Metric``), and each name's first argument must be a literal, so no
  name escapes the checks by being built at run time.
* No name carries a non-base unit (``_ms``, ``_gbps``, ``_rps``, ``_kwh``, ``_percent`` ...); counters end
  in ``_total`` and nothing else does.
* The real ``promtool check metrics`` lints (a) an exposition holding one sample of every metric of the
  code and (b) the live /metrics of each service of the pipeline, running against real Kafka, HAProxy
  and Prometheus. promtool skips families without samples, hence the sample per metric.
* docs/metrics.md lists exactly the metrics the code exports.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.helpers import REPO

METRIC_CLASSES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
                  "Info": "info", "Enum": "stateset"}
# Unit spellings that are not Prometheus base units (seconds, bytes, joules, ratios ...), as name tokens.
NON_BASE_UNITS = {"ms", "msec", "us", "ns", "sec", "secs", "minutes", "hours", "days", "gbps", "mbps", "kbps", "bps",
                  "bits", "rps", "qps", "kwh", "wh", "kw", "mw", "percent", "pct", "kb", "mb", "gb", "tb", "kib",
                  "mib", "gib", "tib", "milliseconds", "microseconds", "nanoseconds", "kilobytes", "megabytes",
                  "gigabytes", "terabytes"}
SOURCE_DIRS = ("opsloop", "collectors", "streams", "controllers")


@dataclass(frozen=True)
class Defined:
    name: str
    kind: str      # counter, gauge, histogram, ...
    where: str     # path:line


def _prometheus_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> metric kind for what a module imports from prometheus_client."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client"):
            for alias in node.names:
                local = alias.asname or alias.name
                if alias.name in METRIC_CLASSES:
                    names[local] = METRIC_CLASSES[alias.name]
                elif alias.name == "Metric":
                    names[local] = "custom"   # Metric(name, documentation, typ): the kind is an argument
    return names


def defined_metrics() -> tuple[list[Defined], list[str]]:
    """Every metric the code defines, and the definitions whose name is not a string literal."""
    found: list[Defined] = []
    dynamic: list[str] = []
    for top in SOURCE_DIRS:
        for src in sorted((REPO / top).rglob("*.py")):
            tree = ast.parse(src.read_text(), str(src))
            local = _prometheus_names(tree)
            if not local:
                continue
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in local):
                    continue
                where = f"{src.relative_to(REPO)}:{node.lineno}"
                first = node.args[0] if node.args else None
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    dynamic.append(where)
                    continue
                kind = local[node.func.id]
                if kind == "custom":
                    typ = node.args[2] if len(node.args) > 2 else None
                    kind = typ.value if isinstance(typ, ast.Constant) else "?"
                found.append(Defined(first.value, kind, where))
    return found, dynamic


def naming_problems(name: str, kind: str) -> list[str]:
    problems = []
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        problems.append("not snake_case")
    bad = sorted(set(name.split("_")) & NON_BASE_UNITS)
    if bad:
        problems.append(f"non-base unit {bad} (use seconds, bytes, joules, requests_per_second, a 0-1 ratio)")
    if kind == "counter" and not name.endswith("_total"):
        problems.append("a counter must end in _total")
    if kind != "counter" and name.endswith("_total"):
        problems.append(f"a {kind} must not end in _total (a count that only grows is a counter)")
    return problems


def promtool_check(exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True,
                          timeout=60)


# Imports every module that defines metrics, gives each metric one sample (promtool skips empty
# families) and prints the exposition: what the services serve, all in one registry. A subprocess,
# so the samples do not leak into the registry of the tests running in this process.
EXPOSE_ALL = r"""
import importlib, sys
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.metrics import MetricWrapperBase
for module in sys.argv[1:]:
    importlib.import_module(module)
for collector in list(REGISTRY._collector_to_names):
    if isinstance(collector, MetricWrapperBase):
        child = collector.labels(*["x"] * len(collector._labelnames)) if collector._labelnames else collector
        for op in ("inc", "observe", "set", "info", "state"):
            if hasattr(child, op):
                getattr(child, op)({"info": {"k": "v"}}.get(op, 1) if op != "state" else child._states[0])
                break
from opsloop.records import Finding
from opsloop.streams.agents.findings_sink import ACTIVE   # the custom collector: one open finding
ACTIVE.update(Finding(detector="x.y", what="w", where={"host": "h"}, first_seen=0.0, last_seen=0.0))
sys.stdout.write(generate_latest(REGISTRY).decode())
"""


def defining_modules(defs: list[Defined]) -> list[str]:
    """Importable names of the defining files: the stage folders are packages under ``opsloop`` (setup.py).
    Importing ``controllers.x`` by its folder name would load a second copy and register every metric twice."""
    names = set()
    for d in defs:
        dotted = d.where.split(":")[0][:-3].replace("/", ".")
        names.add(f"opsloop.{dotted}" if dotted.split(".")[0] in SOURCE_DIRS[1:] else dotted)
    return sorted(names)


# ----------------------------------------------------------------------------------------- static checks
def test_every_metric_name_is_a_literal_and_the_scan_finds_them_all() -> None:
    defs, dynamic = defined_metrics()
    assert not dynamic, f"metric names built at run time escape the naming checks: {dynamic}"
    names = {d.name for d in defs}
    # The scan sees plain metrics, shared ones and the custom collector's families.
    assert {"opsloop_spool_dropped_records_total", "opsloop_edge_fail_static", "opsloop_finding_active",
            "opsloop_keystone_small_request_p95_seconds"} <= names
    assert len(defs) >= 100


def test_names_use_base_units_and_counters_end_in_total() -> None:
    defs, _ = defined_metrics()
    bad = [f"{d.where}: {d.name} ({d.kind}): {p}" for d in defs for p in naming_problems(d.name, d.kind)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name, kind", [
    ("opsloop_keystone_small_request_p95_ms", "gauge"), ("opsloop_netperf_throughput_gbps", "gauge"),
    ("opsloop_edge_demand_rps", "gauge"), ("opsloop_power_kwh_per_year", "gauge"), ("opsloop_x_percent", "gauge"),
    ("opsloop_x_pct", "gauge"), ("opsloop_link_mbps", "gauge"), ("opsloop_spool_dropped_records", "counter"),
    ("opsloop_spool_dropped_records_total", "gauge")])
def test_the_naming_check_rejects_the_old_names(name: str, kind: str) -> None:
    assert naming_problems(name, kind)


def test_the_renames_table_covers_every_old_name_and_no_old_name_is_left() -> None:
    """docs/metrics.md's renames table names each old metric once; none of them appears anywhere else."""
    doc = (REPO / "docs" / "metrics.md").read_text()
    table = doc.split("## Renamed in this release", 1)[1]
    rows = re.findall(r"^\| `([a-z_:0-9]+)` \| `([a-z_:0-9]+)` \|", table, re.M)
    assert len(rows) >= 15
    old = {o for o, _ in rows}
    defs, _ = defined_metrics()
    assert not old & {d.name for d in defs}
    assert {n for _, n in rows if not n.startswith("opsloop:")} <= {d.name for d in defs}
    pattern = re.compile(r"(?<![a-z0-9_:])(" + "|".join(map(re.escape, sorted(old))) + r")(?![a-z0-9_])")
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    left = []
    for f in files:
        # the table itself, and this file's negative cases
        if f in ("docs/metrics.md", "tests/e2e/test_metric_names.py"):
            continue
        path = REPO / f
        if path.is_file():
            left += [f"{f}: {m}" for m in pattern.findall(path.read_text(errors="replace"))]
    assert not left, "\n".join(left)


def test_docs_list_exactly_the_exported_metrics() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    listed = doc.split("## Renamed in this release", 1)[0]
    rows = dict(re.findall(r"^\| `(opsloop_[a-z0-9_]+)` \| (\w+) \|", listed, re.M))
    defs, _ = defined_metrics()
    code = {d.name: d.kind for d in defs}
    assert set(rows) == set(code), (sorted(set(code) - set(rows)), sorted(set(rows) - set(code)))
    assert {n: k for n, k in rows.items() if code[n] != k} == {}


# ----------------------------------------------------------------------------------------- promtool
@pytest.mark.integration
def test_promtool_finds_old_style_names() -> None:
    """The check below can fail: promtool rejects what the renames fixed."""
    bad = ("# HELP opsloop_keystone_small_request_p95_ms p95\n# TYPE opsloop_keystone_small_request_p95_ms gauge\n"
           'opsloop_keystone_small_request_p95_ms{host="a"} 750\n'
           "# HELP opsloop_spool_dropped_records dropped\n# TYPE opsloop_spool_dropped_records counter\n"
           'opsloop_spool_dropped_records{collector="a"} 3\n')
    r = promtool_check(bad)
    assert r.returncode != 0
    assert "abbreviated units" in r.stdout + r.stderr and '"_total" suffix' in r.stdout + r.stderr


@pytest.mark.integration
def test_promtool_check_metrics_passes_on_one_sample_of_every_metric() -> None:
    defs, _ = defined_metrics()
    out = subprocess.run([sys.executable, "-c", EXPOSE_ALL, *defining_modules(defs)], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    exposed = set(re.findall(r"^# TYPE (opsloop_\w+) ", out.stdout, re.M))
    samples = set(re.findall(r"^(opsloop_\w+?)(?:_bucket|_count|_sum|_created)?[{ ]", out.stdout, re.M))
    assert {d.name.removesuffix("_total") for d in defs} <= {n.removesuffix("_total") for n in exposed}
    assert {d.name for d in defs} <= samples | {n + "_total" for n in samples}   # every family has a sample
    r = promtool_check(out.stdout)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


# ----------------------------------------------------------------------------------------- live services
@pytest.mark.integration
def test_promtool_check_metrics_passes_on_every_service_of_the_pipeline(stack, lab_edge, tmp_path: Path) -> None:
    """The live loop (lab edge with traffic -> haproxy collector -> worker -> edge control -> actuator ->
    HAProxy), the paging service, and the worker fed power/netperf/Keystone samples: each service's
    /metrics, once its own families carry samples, passes `promtool check metrics` and the naming check."""
    from opsloop.lab.traffic import TrafficGenerator
    from opsloop.records import metric
    from opsloop.topics import Topic
    from opsloop.wire import encode_batch
    from tests.alerting import start_actuator as start_paging
    from tests.e2e.pipeline import loop_config, start_collector, start_weight_actuator, start_worker
    from tests.e2e.test_edge_loop import EdgeControl
    from tests.helpers import unique, wait_until
    from tests.streams.agents.test_integration import produce

    lab_edge.start(capacities={"near": 40.0})
    loop = loop_config(tmp_path, stack, lab_edge.admin_socket)
    config, doc, edge_port, actuator_port = loop.config, loop.doc, loop.edge_port, loop.actuator_port
    tag, now = unique("names"), time.time()
    samples = [
        (Topic.IPMI, f"{tag}-gen3", encode_batch(metric("ipmi_power", {"watts": 155.0},
                                                        {"host": f"{tag}-gen3", "source": "dcmi", "generation": "gen3",
                                                         "raw_capacity_tb": "96"}, now - 60 + i) for i in range(3))),
        (Topic.NETPERF, f"{tag}-set", encode_batch(metric("netperf_throughput", {"mean_gbps": g, "failed_targets": 0},
                                                          {"host": "bench", "target_set": f"{tag}-set", "queues": "8"},
                                                          now - 60 + i) for i, g in enumerate((8.4, 8.4)))),
        (Topic.KEYSTONE, f"{tag}-ks", encode_batch([metric("s3_frontend_requests", {
            "requests": 10.0, "small_requests": 10.0, "small_p50_ms": 600.0, "small_p95_ms": 750.0}, {"host": f"{tag}-ks"},
            now - 60)]))]
    procs = [start_worker(tmp_path, config, doc, stack), start_collector("haproxy", tmp_path, config, doc, stack)]
    ctl = EdgeControl(config, tmp_path / "edge-control", loop.api_port, loop.token).start()
    actuator = start_weight_actuator(tmp_path, loop, stack)
    paging, paging_port = start_paging(tmp_path / "paging", stack.kafka_bootstrap, stack.alertmanager_url)
    gen = TrafficGenerator(lab_edge.url, 40.0, workers=4).start()
    # Per service: its port and families that must carry samples before its exposition is checked.
    services = {
        "stream worker": (doc["stream"]["metrics_port"], {
            "opsloop_lb_server_requests_per_second", "opsloop_power_energy_per_year_joules",
            "opsloop_power_eur_per_usable_byte_year", "opsloop_netperf_throughput_bytes_per_second",
            "opsloop_keystone_small_request_p95_seconds", "opsloop_stream_records_total"}),
        "haproxy collector": (doc["collector"]["metrics_port"], {
            "opsloop_collector_rounds_total", "opsloop_spool_dropped_records_total"}),
        "edge control": (edge_port, {
            "opsloop_edge_demand_requests_per_second", "opsloop_edge_origin_capacity_requests_per_second",
            "opsloop_edge_origin_load_requests_per_second", "opsloop_edge_shed_requests_per_second",
            "opsloop_edge_weight"}),
        "actuator": (actuator_port, {"opsloop_actuator_weight", "opsloop_actuator_applied_version"}),
        "paging": (paging_port, {"opsloop_paging_last_poll_timestamp_seconds"}),
    }

    def scrape(port: int) -> str:
        return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text

    def with_samples(text: str) -> set[str]:
        return set(re.findall(r"^(opsloop_\w+)[{ ]", text, re.M))

    # This test's own series (the worker also reads what earlier tests left on the shared topics, so a
    # family having samples does not mean ours have arrived).
    own = {
        "keystone": rf'^opsloop_keystone_small_request_p95_seconds\{{host="{tag}-ks"\}} (\S+)$',
        "netperf": rf'^opsloop_netperf_throughput_bytes_per_second\{{label="",queues="8",target_set="{tag}-set"\}} '
                   r"(\S+)$",
        "power": rf'^opsloop_power_energy_per_year_joules\{{generation="gen3",host="{tag}-gen3"\}} (\S+)$',
    }

    def ready(port: int, needed: set[str]) -> str | None:
        text = scrape(port)
        if port == doc["stream"]["metrics_port"] and not all(re.search(rx, text, re.M) for rx in own.values()):
            return None
        return text if needed <= with_samples(text) else None

    try:
        produce(stack.kafka_bootstrap, samples)   # once the worker is up (it creates the topics)
        texts: dict[str, str] = {}
        for service, (port, needed) in services.items():
            texts[service] = wait_until(lambda p=port, n=needed: ready(p, n), timeout=180, interval=2,
                                        what=f"{service}: samples of {sorted(needed)}")
        # The converted values: 750 ms -> 0.75 s, 8.4 Gb/s -> 1.05e9 B/s, 155 W for a year in joules.
        ks = re.search(own["keystone"], texts["stream worker"], re.M)
        assert ks is not None and float(ks.group(1)) == pytest.approx(0.75)
        np_ = re.search(own["netperf"], texts["stream worker"], re.M)
        assert np_ is not None and float(np_.group(1)) == pytest.approx(8.4e9 / 8)
        joules = re.search(own["power"], texts["stream worker"], re.M)
        assert joules is not None and float(joules.group(1)) == pytest.approx(155 * 8760 * 3600, rel=0.01)
        for service, text in texts.items():
            r = promtool_check(text)
            assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), f"{service}: {r.stdout}{r.stderr}"
            types = dict(re.findall(r"^# TYPE (opsloop_\w+) (\w+)$", text, re.M))
            bad = {n: naming_problems(n, k) for n, k in types.items()}
            assert not {n: p for n, p in bad.items() if p}, (service, bad)
    finally:
        gen.stop()
        for p in (paging, actuator):
            p.stop()
        ctl.stop()
        for p in reversed(procs):
            p.stop()

