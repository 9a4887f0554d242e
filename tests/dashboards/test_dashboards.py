"""Grafana dashboards: committed JSON = generator output; every panel complete; every query valid
PromQL on the real Prometheus; the LB and pipeline panels return data from a real end-to-end run.

No Grafana server is installed here (the set-up has none), so the dashboards are checked where they can
fail: their structure, and their queries against a live Prometheus filled by the pipeline.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests

from opsloop.lab.traffic import TrafficGenerator
from tests.e2e.pipeline import (EdgeControl, loop_config, pipeline_config, start_collector, start_weight_actuator,
                                start_worker, stop_all)
from tests.helpers import REPO, prom_query, unique, wait_until

DASHBOARDS = REPO / "dashboards"
# What Grafana substitutes before a query reaches Prometheus (All selected for every variable).
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
KNOWN_UNITS = {"watt", "kwatth", "currencyEUR", "bps", "percentunit", "s", "short", "none", "reqps", "ops", "bool"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_generate", DASHBOARDS / "generate.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod          # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()


def flagged_panel_titles(flag: str) -> dict[str, list[str]]:
    """Dashboard uid -> titles of the panels marked ``flag`` (``e2e_lb``: the HAProxy end-to-end run
    must fill them with data; ``e2e_loop``: the closed edge loop must)."""
    out: dict[str, list[str]] = {}
    for fn in GEN.DASHBOARDS.values():
        d = fn()
        titles = [p.title for p in d.panels if getattr(p, flag)]
        if titles:
            out[d.uid] = titles
    return out


def _committed() -> dict[str, dict[str, Any]]:
    import json

    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def substitute(expr: str, variables: dict[str, str]) -> str:
    """A panel/variable query as Grafana sends it: macros expanded, $var / ${var} replaced."""
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), expr)


def variable_query_as_promql(query: str) -> str:
    """label_values(metric{sel}, label) -> the PromQL Grafana's Prometheus datasource runs for it."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert m, f"unsupported variable query {query!r}"
    return f"count by ({m.group(2)}) ({m.group(1)})"


def all_queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable, with variables set to All."""
    variables = {v["name"]: ".*" for v in model["templating"]["list"] if v["type"] == "query"}
    out = [(f"{model['uid']} / {p['title']} / {t['refId']}", substitute(t["expr"], variables))
           for p in model["panels"] for t in p["targets"]]
    out += [(f"{model['uid']} / variable {v['name']}", substitute(variable_query_as_promql(v["query"]), variables))
            for v in model["templating"]["list"] if v["type"] == "query"]
    return out


# -------------------------------------------------------------------------------------------- structure
def test_committed_json_equals_generator_output() -> None:
    generated = GEN.build()
    assert set(generated) == set(_committed()), "run dashboards/generate.py"
    for name, model in generated.items():
        assert (DASHBOARDS / f"{name}.json").read_text() == GEN.render(model), f"{name}.json is stale"
    assert GEN.main(["--check"]) == 0


def test_check_mode_detects_a_stale_file(tmp_path: Path) -> None:
    assert GEN.main(["--out", str(tmp_path)]) == 0
    victim = tmp_path / "opsloop-edge.json"
    victim.write_text(victim.read_text().replace("Edge weights", "Edge weightz"))
    assert GEN.main(["--out", str(tmp_path), "--check"]) == 1


@pytest.mark.parametrize("name", sorted(_committed()))
def test_every_panel_has_title_description_unit_and_datasource_variable(name: str) -> None:
    model = _committed()[name]
    assert model["uid"] == name and model["title"] and model["description"]
    names = [v["name"] for v in model["templating"]["list"]]
    assert names[0] == "datasource" and len(names) >= 2, names
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for p in model["panels"]:
        assert p["title"].strip() and len(p["description"]) > 20, p
        assert p["fieldConfig"]["defaults"]["unit"] in KNOWN_UNITS, (p["title"], p["fieldConfig"]["defaults"]["unit"])
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        for t in p["targets"]:
            # $1 in label_replace is a regex group: Grafana leaves names that are no variable alone
            used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", t["expr"])) - {"__rate_interval", "__interval", "__range"}
            assert used <= set(names), (p["title"], used - set(names))
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0


def test_uids_and_variables_match_the_alert_dashboard_links() -> None:
    """Alert annotations link to /d/<uid>/...?var-<name>=...: those dashboards and variables must exist."""
    models = {m["uid"]: m for m in _committed().values()}
    links = set()
    for f in (REPO / "alerts" / "rules").glob("*.yml"):
        links |= set(re.findall(r"/d/([\w-]+)/[\w-]+(?:\?var-(\w+)=)?", f.read_text()))
    assert links, "no dashboard links found in alerts/rules"
    for uid, var in links:
        assert uid in models, f"alert links to dashboard {uid!r} that does not exist"
        if var:
            assert var in [v["name"] for v in models[uid]["templating"]["list"]], (uid, var)


def test_substitution_matches_what_grafana_sends() -> None:
    assert substitute('rate(x{a=~"$a"}[$__rate_interval]) / ${b}', {"a": ".*", "b": "1"}) == 'rate(x{a=~".*"}[1m]) / 1'
    assert variable_query_as_promql('label_values(m{x="1"}, host)') == 'count by (host) (m{x="1"})'


# -------------------------------------------------------------------------------------------- live Prometheus
def empty_panels(prometheus_url: str, models: dict[str, dict[str, Any]], expected: dict[str, list[str]],
                 scoped: dict[str, str]) -> list[str]:
    """The queries of the expected panels (variables narrowed by ``scoped``) that return no series."""
    missing = []
    for uid, titles in expected.items():
        for p in models[uid]["panels"]:
            if p["title"] not in titles:
                continue
            for t in p["targets"]:
                expr = substitute(t["expr"], scoped)
                if not prom_query(prometheus_url, expr):
                    missing.append(f"{uid} / {p['title']}: {expr}")
    return missing


@pytest.mark.integration
def test_every_query_is_valid_promql_on_the_real_prometheus(stack) -> None:
    errors = []
    n = 0
    for model in _committed().values():
        for where, expr in all_queries(model):
            n += 1
            r = requests.get(f"{stack.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
            body = r.json()
            if r.status_code != 200 or body.get("status") != "success":
                errors.append(f"{where}: {expr}: {body.get('error')}")
    assert n > 60
    assert not errors, "\n".join(errors)
    # The check can fail: a broken query is refused by the same path.
    r = requests.get(f"{stack.prometheus_url}/api/v1/query", params={"query": "sum by (x (up)"}, timeout=10)
    assert r.json()["status"] == "error"


@pytest.mark.integration
def test_lb_and_pipeline_panels_return_data_from_an_end_to_end_run(stack, lab_edge, tmp_path: Path) -> None:
    """lab edge (HAProxy + 2 origins) + traffic -> haproxy collector -> Kafka -> stream worker -> Prometheus."""
    lab_edge.start()
    lb = unique("edge")
    config, doc = pipeline_config(tmp_path, stack, {"haproxy": {"instances": {lb: str(lab_edge.admin_socket)}}})
    worker = start_worker(tmp_path, config, doc, stack)
    collector = start_collector("haproxy", tmp_path, config, doc, stack)
    gen = TrafficGenerator(lab_edge.url, 20.0, workers=4).start()
    try:
        wait_until(lambda: len(prom_query(stack.prometheus_url,
                                          f'count_over_time(opsloop_lb_server_requests_per_second{{lb="{lb}"}}[1m]) > 3')) == 2,
                   timeout=120, interval=1, what="request rates of both origins in Prometheus")
        expected = flagged_panel_titles("e2e_lb")
        assert sum(len(v) for v in expected.values()) >= 12
        models = {m["uid"]: m for m in _committed().values()}
        # Narrow every variable to this run's edge where it applies, else All.
        scoped = {"lb": lb, "origin": "near|far", "collector": "haproxy", "topic": "telemetry.lb", "agent": ".*"}

        scoped = {**{v: ".*" for v in ("listener", "detector")}, **scoped}
        # Rates need two scrapes of a counter and histograms a full window: wait, do not assert on time.
        wait_until(lambda: not empty_panels(stack.prometheus_url, models, expected, scoped), timeout=90, interval=2,
                   what="data in every LB/pipeline panel")
        assert empty_panels(stack.prometheus_url, models, expected, scoped) == []
        # And the values mean something: the edge's demand is the traffic we sent (~20 req/s).
        demand = prom_query(stack.prometheus_url, substitute(
            models["opsloop-edge"]["panels"][0]["targets"][0]["expr"], scoped))
        assert len(demand) == 1 and 10 < float(demand[0]["value"][1]) < 30
    finally:
        gen.stop()
        collector.stop()
        worker.stop()


def _exported_metric_names() -> set[str]:
    """Every opsloop_* series name the code can export (prometheus_client suffixes included)."""
    names: set[str] = set()
    # prometheus_client's classes, and custom collectors' Metric (imported as PromMetric) families
    pattern = re.compile(r"\b(Gauge|Counter|Histogram|Summary|PromMetric|GaugeMetricFamily)\(\s*\"(opsloop_\w+)\"")
    for src in REPO.glob("**/*.py"):
        if any(part.startswith(".") for part in src.relative_to(REPO).parts) or "tests" in src.parts:
            continue
        for kind, name in pattern.findall(src.read_text(errors="replace")):
            if kind == "Counter":
                names.add(name if name.endswith("_total") else name + "_total")
            elif kind in ("Histogram", "Summary"):
                names |= {name + s for s in ("_bucket", "_count", "_sum")}
            else:
                names.add(name)
    return names


def test_every_metric_a_panel_queries_is_exported_by_the_code() -> None:
    """A panel on a misspelt metric is valid PromQL and stays empty forever: check the names against the code."""
    exported = _exported_metric_names()
    assert {"opsloop_edge_weight", "opsloop_actuator_errors_total", "opsloop_anomaly_observed"} <= exported
    unknown = set()
    for model in _committed().values():
        for where, expr in all_queries(model):
            unknown |= {(where, n) for n in re.findall(r"\b(opsloop_[a-z0-9_]+)", expr) if n not in exported}
    assert not unknown, "\n".join(f"{w}: {n}" for w, n in sorted(unknown))


def _stream_detector_names() -> set[str]:
    """'<family>.<name>' string constants in streams/: the findings a stream worker raises and exports."""
    pattern = re.compile(r"^[a-z]+\.[a-z][a-z0-9_]*$")
    trees = [ast.parse(src.read_text()) for src in sorted((REPO / "streams").rglob("*.py"))]
    return {node.value for tree in trees for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value)}


def test_findings_panels_query_only_findings_a_stream_worker_exports() -> None:
    """opsloop_finding_active is the stream worker's alone (streams/agents/findings_sink.py). The edge findings come
    from the edge controller and the actuators, which send them to the findings topic only: the edge board's table
    of them was valid PromQL on a metric that exists, and empty forever."""
    detectors = _stream_detector_names()
    assert {"firewall.unprotected_port", "power.generation_deviation", "keystone.heavy_hitter"} <= detectors
    assert "edge.fail_static" not in detectors
    empty = []
    for model in _committed().values():
        for where, expr in all_queries(model):
            for sel in re.findall(r"opsloop_finding_active\{([^}]*)\}", expr):
                m = re.search(r'detector(=~|=)"([^"]*)"', sel)
                if m and not any(re.fullmatch(m.group(2) if m.group(1) == "=~" else re.escape(m.group(2)), d)
                                 for d in detectors):
                    empty.append(f"{where}: {sel}")
    assert not empty, "no stream detector matches:\n" + "\n".join(empty)


@pytest.mark.integration
def test_control_loop_panels_show_decided_applied_and_observed_shares(stack, lab_edge, tmp_path: Path) -> None:
    """The closed edge loop, live (lab edge with traffic -> collector -> worker -> edge control service ->
    `opsloop weights run` -> HAProxy), scraped by Prometheus: every control-loop panel fills, and the
    decided, applied and observed shares of the "Share per origin" panel agree once the loop has settled."""

    lab_edge.start(capacities={"near": 40.0})
    loop = loop_config(tmp_path, stack, lab_edge.admin_socket)
    config, doc, lb = loop.config, loop.doc, loop.lb
    worker = start_worker(tmp_path, config, doc, stack)
    collector = start_collector("haproxy", tmp_path, config, doc, stack)
    ctl = EdgeControl(config, tmp_path / "edge-control", loop.api_port, loop.token).start()
    stack.add_scrape_target(f"edge-control-{loop.edge_port}", f"127.0.0.1:{loop.edge_port}")
    actuator = start_weight_actuator(tmp_path, loop, stack)
    gen = TrafficGenerator(lab_edge.url, 80.0, workers=8).start()
    try:
        models = {m["uid"]: m for m in _committed().values()}
        expected = flagged_panel_titles("e2e_loop")
        assert sum(len(v) for v in expected.values()) >= 8
        scoped = {"lb": lb, "origin": "near|far", "listener": "web"}
        wait_until(lambda: not empty_panels(stack.prometheus_url, models, expected, scoped), timeout=180, interval=2,
                   what="data in every control-loop panel")

        [share] = [p for p in models["opsloop-edge"]["panels"] if p["title"].startswith("Share per origin")]
        decided_q, applied_q, observed_q = (substitute(t["expr"], scoped) for t in share["targets"])

        def near(expr: str) -> float | None:
            rows = [r for r in prom_query(stack.prometheus_url, expr) if r["metric"].get("origin") == "near"]
            return float(rows[0]["value"][1]) if rows else None

        agreed: list[tuple[float, float, float]] = []

        def settled() -> tuple[float, float, float] | None:
            # the three agree on 6 polls in a row (~10 s) with the same decision: the initial
            # assignment (all on near) agrees too for the few seconds before the first shed, and a
            # single agreeing poll caught it (a fresh-clone run failed with (1.0, 1.0, 1.0))
            d, a, o = near(decided_q), near(applied_q), near(observed_q)
            # applied: integer HAProxy weights 0-256 (rounding); observed: requests actually sent (noisy rates)
            if d is None or a is None or o is None or abs(d - a) > 0.01 or abs(a - o) > 0.1 \
                    or (agreed and abs(agreed[-1][0] - d) > 0.01):
                agreed.clear()
            if d is not None and a is not None and o is not None and abs(d - a) <= 0.01 and abs(a - o) <= 0.1:
                agreed.append((d, a, o))
            return agreed[-1] if len(agreed) >= 6 else None

        d, a, o = wait_until(settled, timeout=180, interval=2, what="decided = applied = observed near share")
        # The near origin (40 req/s of 80 offered) gets about half, not everything and not nothing.
        assert 0.3 < d < 0.7, (d, a, o)
    finally:
        stop_all(gen, actuator, ctl, collector, worker)


@pytest.mark.integration
def test_anomaly_band_panel_draws_the_band_around_the_observed_value(stack, tmp_path: Path) -> None:
    """Simulated BMC (ipmi_sim) -> `opsloop collect ipmi` (real ipmitool) -> Kafka -> stream worker (anomaly
    detector on ipmi_power.watts, the lab's settings) -> Prometheus: the band panel's four queries return the
    series; at a flat draw the observed value lies inside [lower, upper] around the expected one, and a
    power jump puts it above the upper edge."""
    import uuid

    import yaml

    from opsloop.lab.bmcsim import BMCFleet, BMCSpec
    from opsloop.lab.pipeline import LAB_ANOMALY
    from opsloop.stack import free_port
    from tests.helpers import write_config

    host = f"stor-g1-{uuid.uuid4().hex[:6]}"
    with BMCFleet([BMCSpec(host, watts=248)], tmp_path / "bmcs") as fleet:
        (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(fleet.inventory({host: {"generation": "gen1"}})))
        config, doc = pipeline_config(tmp_path, stack, {"ipmi": {"inventory": str(tmp_path / "inventory.yaml"),
                                                                 "timeout_s": 8}})
        doc["streams"] = {"detectors": {"anomaly": LAB_ANOMALY}}
        write_config(config, doc)
        worker = start_worker(tmp_path, config, doc, stack)
        cdoc = {**doc, "collector": {**doc["collector"], "metrics_port": free_port()}}
        collector = start_collector("ipmi", tmp_path, write_config(tmp_path / "collector.yaml", cdoc), cdoc, stack)
        try:
            model = _committed()["opsloop-pipeline"]
            [band] = [p for p in model["panels"] if p["title"].startswith("Anomaly band")]
            assert band["repeat"] == "anomaly_series"
            assert {o["matcher"]["options"] for o in band["fieldConfig"]["overrides"]
                    if any(p["id"] == "custom.fillBelowTo" for p in o["properties"])} == {"upper"}
            scoped = {"anomaly_metric": "ipmi_power", "anomaly_field": "watts", "anomaly_series": f".*host={host}.*"}
            queries = {t["legendFormat"]: substitute(t["expr"], scoped) for t in band["targets"]}
            assert set(queries) == {"observed", "expected", "lower", "upper"}

            def values() -> dict[str, float] | None:
                got = {k: prom_query(stack.prometheus_url, q) for k, q in queries.items()}
                return {k: float(v[0]["value"][1]) for k, v in got.items()} if all(got.values()) else None

            flat = wait_until(values, timeout=240, interval=2, what="the anomaly band of the BMC's watts in Prometheus")
            assert flat["observed"] == pytest.approx(248, abs=2)
            assert flat["lower"] <= flat["expected"] <= flat["upper"]
            assert flat["lower"] <= flat["observed"] <= flat["upper"], flat

            fleet[host].set_watts(600)
            jumped = wait_until(lambda: (v := values()) and v["observed"] > 500 and v, timeout=120, interval=2,
                                what="the jump in the observed value")
            assert jumped["observed"] > flat["upper"], (flat, jumped)
        finally:
            collector.stop()
            worker.stop()
