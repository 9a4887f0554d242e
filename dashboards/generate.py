"""Generate opsloop's Grafana dashboards (provisioned JSON in ``dashboards/*.json``) from code.

The dashboards are built with the Grafana Foundation SDK (``grafana-foundation-sdk``: typed builders
generated from Grafana's own schemas), so the JSON follows Grafana's dashboard model as it changes.
On top of it, a small spec: one function per dashboard, one :class:`Panel` per graph, so a query is
written once and every panel gets a title, a description, a unit and the dashboard's variables. The
committed JSON must equal this generator's output (``tests/dashboards/test_dashboards.py``); after
a change run::

    .venv/bin/python dashboards/generate.py            # rewrite dashboards/*.json
    .venv/bin/python dashboards/generate.py --check    # exit 1 if the committed JSON is stale

Metric names are the ones the code exports (a test checks them against the ``Gauge(``/``Counter(``/
``Histogram(`` definitions) and the recording rules in ``alerts/rules/recording.yml``; dashboard uids
and variable names match the ``dashboard_url`` links in the alert annotations
(``/d/opsloop-edge/edge-weights?var-lb=...``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import prometheus
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT_DIR = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
AUDIT_DATASOURCE = {"type": "elasticsearch", "uid": "opsloop-audit"}   # provisioned in docker-compose/grafana
RATE = "$__rate_interval"
FULL_WIDTH = 24


def _ref(ds: dict[str, str]) -> dm.DataSourceRef:
    return dm.DataSourceRef(type_val=ds["type"], uid=ds["uid"])


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    description: str
    queries: list[Query]
    unit: str = "short"
    kind: str = "timeseries"      # timeseries | stat | table | bargauge
    width: int = 12
    height: int = 8
    thresholds: list[tuple[float, str]] = field(default_factory=list)   # (from value, colour) above green
    decimals: int | None = None
    max: float | None = None
    # Grafana field overrides (e.g. the anomaly band: fill from "upper" down to "lower").
    overrides: list[dict[str, Any]] = field(default_factory=list)
    repeat: str | None = None     # one panel per selected value of this variable
    # Produced by the HAProxy pipeline that tests/dashboards/test_dashboards.py runs end to end
    # (lab edge -> haproxy collector -> Kafka -> stream worker): its queries must return data there.
    e2e_lb: bool = False
    # Produced by the closed edge loop (edge control service + weight actuator on the lab edge) that the
    # same test file runs: its queries must return data there.
    e2e_loop: bool = False

    def build(self, pid: int, x: int, y: int) -> Any:
        """The SDK builder of this panel at grid position (x, y)."""
        builder: Any = {"timeseries": timeseries.Panel, "stat": stat.Panel, "table": table.Panel,
                        "bargauge": bargauge.Panel}[self.kind]()
        steps = [dm.Threshold(value=None, color="green"), *(dm.Threshold(value=v, color=c) for v, c in self.thresholds)]
        colour = dm.FieldColorModeId.THRESHOLDS if self.kind in ("stat", "bargauge") else dm.FieldColorModeId.PALETTE_CLASSIC
        builder = (builder.id(pid).title(self.title).description(self.description).datasource(_ref(DATASOURCE))
                   .grid_pos(dm.GridPos(h=self.height, w=self.width, x=x, y=y)).unit(self.unit)
                   .thresholds(sdk.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
                   .color_scheme(sdk.FieldColor().mode(colour)))
        if self.decimals is not None:
            builder = builder.decimals(self.decimals)
        if self.max is not None:
            builder = builder.max(self.max)
        if self.repeat:
            builder = builder.repeat(self.repeat).repeat_direction("h")
        for o in self.overrides:
            builder = builder.with_override(dm.MatcherConfig(id_val=o["matcher"]["id"], options=o["matcher"]["options"]),
                                            [dm.DynamicConfigValue(id_val=p["id"], value=p["value"])
                                             for p in o["properties"]])
        for i, q in enumerate(self.queries):
            instant = q.instant or self.kind == "table"
            target = (prometheus.Dataquery().datasource(_ref(DATASOURCE)).expr(q.expr).legend_format(q.legend or "__auto")
                      .ref_id(chr(ord("A") + i)))
            target = target.instant().format(PromQueryFormat.TABLE) if self.kind == "table" else \
                (target.instant() if instant else target.range())
            builder = builder.with_target(target)
        if self.kind == "timeseries":
            if self.thresholds:
                builder = builder.thresholds_style(
                    sdk_common.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED))
            builder = (builder.legend(sdk_common.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                                      .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
                       .tooltip(sdk_common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                                .sort(cm.SortOrder.DESCENDING)))
        elif self.kind in ("stat", "bargauge"):
            builder = builder.reduce_options(sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
            if self.kind == "stat":
                builder = (builder.color_mode(cm.BigValueColorMode.BACKGROUND).graph_mode(cm.BigValueGraphMode.AREA)
                           .text_mode(cm.BigValueTextMode.AUTO))
            else:
                builder = (builder.orientation(cm.VizOrientation.HORIZONTAL)
                           .display_mode(cm.BarGaugeDisplayMode.GRADIENT).show_unfilled(True))
        elif self.kind == "table":
            builder = builder.show_header(True).with_transformation(dm.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {"Time": True, "__name__": True, "job": True}}))
        return builder


@dataclass
class Variable:
    name: str
    label: str
    query: str            # label_values(...) for Prometheus
    multi: bool = True    # False: one value at a time (with All offered only when multi)

    def build(self) -> Any:
        v = (sdk.QueryVariable(self.name).label(self.label).datasource(_ref(DATASOURCE)).query(self.query)
             .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
             .multi(self.multi).include_all(self.multi))
        if self.multi:
            v = v.all_value(".*").current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
        return v


def datasource_variable() -> Any:
    return sdk.DatasourceVariable("datasource").label("Data source").type("prometheus")


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[Variable]
    panels: list[Panel]
    annotations: list[dict[str, Any]] = field(default_factory=list)

    def build(self) -> Any:
        """The SDK builder; panels laid out left to right, top to bottom (Grafana's 24-column grid)."""
        d = (sdk.Dashboard(self.title).uid(self.uid).description(self.description).tags(["opsloop"])
             .timezone("utc").editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s")
             .time("now-6h", "now").version(1)
             .link(sdk.DashboardLink("opsloop").type(dm.DashboardLinkType.DASHBOARDS).tags(["opsloop"])
                   .as_dropdown(True).include_vars(False).keep_time(True))
             .with_variable(datasource_variable()))
        for v in self.variables:
            d = d.with_variable(v.build())
        x = y = row_height = 0
        for pid, p in enumerate(self.panels, start=1):
            if x + p.width > FULL_WIDTH:
                x, y, row_height = 0, y + row_height, 0
            d = d.with_panel(p.build(pid, x, y))
            x += p.width
            row_height = max(row_height, p.height)
        for a in self.annotations:
            d = d.annotation(sdk.AnnotationQuery().name(a["name"]).datasource(_ref(a["datasource"]))
                             .enable(a["enable"]).icon_color(a["iconColor"]))
        return d

    def to_json(self) -> dict[str, Any]:
        model: dict[str, Any] = json.loads(JSONEncoder(sort_keys=False).encode(self.build().build()))
        # Fields Grafana's annotation schema leaves to the data source (Elasticsearch: query and the fields to
        # read) and panel-repeat layout are not typed by the SDK: add them to the encoded model.
        for encoded, spec in zip(model["annotations"].get("list", []), self.annotations):
            encoded.update({k: v for k, v in spec.items() if k not in encoded})
        for panel in model["panels"]:
            if panel.get("repeat"):
                panel["maxPerRow"] = 2
        return model


def findings_panel(detector_regex: str, where: str, what: str) -> Panel:
    return Panel(f"Open {what} findings",
                 f"Findings of the {what} detectors that are open now (opsloop_finding_active == 1), with their where "
                 "labels; the same findings page through Alertmanager.",
                 [Query(f'opsloop_finding_active{{detector=~"{detector_regex}"{where}}} == 1')],
                 kind="table", width=FULL_WIDTH, height=7)


# ---------------------------------------------------------------------------------------------- power
def power() -> Dashboard:
    sel = 'generation=~"$generation", host=~"$host"'
    return Dashboard(
        "opsloop-power", "Fleet power and cost per TB-year",
        "Server power from the BMCs (ipmitool DCMI / SDR) and what it costs per usable TB and year (the "
        "reference fleet: Gen 1/2/3 drew 248/205/155 W; at 0.15 EUR/kWh, 70 % fill and 3x replication a usable TB-year cost "
        "29.10/24.05/9.09 EUR).",
        [Variable("generation", "Generation", "label_values(opsloop_power_watts, generation)"),
         Variable("host", "Host", 'label_values(opsloop_power_watts{generation=~"$generation"}, host)')],
        [
            Panel("Power draw per server", "Smoothed power draw read from each server's BMC (opsloop_power_watts).",
                  [Query(f"opsloop_power_watts{{{sel}}}", "{{host}} ({{generation}})")], unit="watt"),
            Panel("Median draw per generation", "Median smoothed draw of each server generation: the norm a "
                  "server is compared with by the power.generation_deviation detector.",
                  [Query('opsloop_power_generation_median_watts{generation=~"$generation"}', "{{generation}}")],
                  unit="watt"),
            Panel("Power cost per usable TB-year", "Power cost (EUR) per usable TB and year for each server, from "
                  "its draw, the price per kWh, raw capacity, fill ratio and protection (replica:3, ec:2+1 ...). "
                  "Exported per usable byte-year (base unit), shown per TB (x 1e12).",
                  [Query(f"1e12 * opsloop_power_eur_per_usable_byte_year{{{sel}}}")], unit="currencyEUR", kind="table",
                  decimals=2),
            Panel("Cost per usable TB-year by generation and protection", "Average over the servers of each "
                  "generation and protection scheme: the reference cost table, computed from live readings.",
                  [Query('1e12 * avg by (generation, protection) (opsloop_power_eur_per_usable_byte_year'
                         '{generation=~"$generation"})', "{{generation}} {{protection}}")],
                  unit="currencyEUR", kind="bargauge", decimals=2),
            Panel("Power cost per year", "Yearly power cost at the current draw, summed per generation.",
                  [Query(f"sum by (generation) (opsloop_power_eur_per_year{{{sel}}})", "{{generation}}")],
                  unit="currencyEUR"),
            Panel("Energy per year", "Yearly energy at the current draw, summed per generation (exported in "
                  "joules, shown in kWh as prices and bills are per kWh: 1 kWh = 3.6 MJ).",
                  [Query(f"sum by (generation) (opsloop_power_energy_per_year_joules{{{sel}}}) / 3.6e6",
                         "{{generation}}")],
                  unit="kwatth"),
            Panel("BMC read errors", "Errors of the IPMI collector per second by kind (timeout, auth, "
                  "unreachable, parse ...). A dead BMC shows here, not as a zero reading.",
                  [Query(f'sum by (kind) (rate(opsloop_collector_errors_total{{collector="ipmi"}}[{RATE}]))',
                         "{{kind}}")], unit="ops", width=FULL_WIDTH, height=6),
            findings_panel("power[.].*", ', host=~"$host"', "power"),
        ])


# ---------------------------------------------------------------------------------------------- netperf
def netperf() -> Dashboard:
    sel = 'target_set=~"$target_set", label=~"$label"'
    return Dashboard(
        "opsloop-netperf", "Network throughput vs baselines",
        "netperf TCP_STREAM throughput per target set, label and queue count against its baseline (reference "
        "runs: 8.4 Gb/s with 8 queues on the good kernel, ~3.5 Gb/s on the bad one).",
        [Variable("target_set", "Target set", "label_values(opsloop_netperf_throughput_bytes_per_second, target_set)"),
         Variable("label", "Label", 'label_values(opsloop_netperf_throughput_bytes_per_second{target_set=~"$target_set"}, label)')],
        [
            Panel("Throughput vs baseline", "Last result of each series (solid) and its baseline: a drop of more "
                  "than the configured ratio opens a netperf finding. Exported in bytes/s, drawn in bits/s (x 8).",
                  [Query(f"8 * opsloop_netperf_throughput_bytes_per_second{{{sel}}}", "{{target_set}} {{label}} q={{queues}}"),
                   Query(f"8 * opsloop_netperf_baseline_bytes_per_second{{{sel}}}",
                         "baseline {{target_set}} {{label}} q={{queues}}")],
                  unit="bps", width=FULL_WIDTH),
            Panel("Throughput / baseline", "Last result divided by the baseline; below 0.8 is a regression.",
                  [Query(f"opsloop_netperf_throughput_ratio{{{sel}}}", "{{target_set}} {{label}} q={{queues}}")],
                  unit="percentunit", thresholds=[(0.0, "red"), (0.8, "green")]),
            Panel("Speed-up with more queues", "Throughput with the most queues over the fewest: ~1.1 means the "
                  "queues do not pay off (the old kernel measured: 3.28 -> 3.57 Gb/s), ~2.6 is the good kernel.",
                  [Query(f"opsloop_netperf_queue_speedup{{{sel}}}",
                         "{{target_set}} {{label}} {{queues_low}}->{{queues_high}}")], unit="none", decimals=2,
                  thresholds=[(0.0, "red"), (1.5, "green")]),
            Panel("Throughput by queue count", "Latest throughput per queue count across the selected series.",
                  [Query(f"8 * max by (queues) (opsloop_netperf_throughput_bytes_per_second{{{sel}}})", "{{queues}} queues")],
                  unit="bps", kind="bargauge"),
            Panel("netperf run errors", "Errors of the netperf collector per second by kind (no netserver, "
                  "timeout, parse).",
                  [Query(f'sum by (kind) (rate(opsloop_collector_errors_total{{collector="netperf"}}[{RATE}]))',
                         "{{kind}}")], unit="ops"),
            findings_panel("netperf[.].*", ', target_set=~"$target_set"', "throughput"),
        ])


# ---------------------------------------------------------------------------------------------- keystone
def keystone() -> Dashboard:
    sel = 'host=~"$host"'
    return Dashboard(
        "opsloop-keystone", "Keystone load and heavy hitters",
        "Keystone token-validation latency and load, and the credentials that dominate it (measured: <10 ms "
        "with caching, >=600 ms without; a nightly accounting peak 03:10-04:10 is normal).",
        [Variable("host", "Keystone host", "label_values(opsloop_keystone_window_validations, host)")],
        [
            Panel("p95 latency of small requests", "p95 of requests below 64 KiB in and out, per collection round "
                  "and over the detector's last closed window (measured: ~750 ms uncached, ~100 ms cached).",
                  [Query(f"opsloop_keystone_small_request_p95_seconds{{{sel}}}", "{{host}} round"),
                   Query(f"opsloop_keystone_small_request_p95_window_seconds{{{sel}}}", "{{host}} window")],
                  unit="s", thresholds=[(0.5, "red")]),
            Panel("Latency regime", "Typical latency of the current regime per source (access log, probe): a jump "
                  "from ~10 ms to ~600 ms means token caching is off.",
                  [Query(f"opsloop_keystone_latency_regime_seconds{{{sel}}}", "{{host}} {{source}}")], unit="s"),
            Panel("Validations in the sliding window", "Token validations (auth/tokens, s3tokens, ec2tokens) "
                  "counted in the heavy-hitter window.",
                  [Query(f"opsloop_keystone_window_validations{{{sel}}}", "{{host}}")], unit="short"),
            Panel("Heavy hitters: top credentials by share", "The 10 credentials with the largest share of "
                  "validations in the sliding window (bounded-memory sketch); the ones to rate-limit or cache.",
                  [Query(f"topk(10, opsloop_keystone_credential_share{{{sel}}})", "{{credential}} on {{host}}",
                         instant=True)], unit="percentunit", kind="bargauge", max=1.0),
            Panel("Nightly accounting window", "1 during 03:10-04:10 Europe/Zurich, when the accounting peak is "
                  "expected and Keystone load alerts are muted.",
                  [Query("opsloop:keystone_accounting_window:bool", "accounting window")], unit="bool",
                  width=FULL_WIDTH, height=4),
            findings_panel("keystone[.].*", ', host=~"$host"', "Keystone"),
        ])


# ---------------------------------------------------------------------------------------------- firewall
def firewall() -> Dashboard:
    sel = 'hypervisor=~"$hypervisor"'
    return Dashboard(
        "opsloop-firewall", "Firewall coverage per hypervisor",
        "Security-group coverage of VM ports per hypervisor from iptables-save, and ruleset/package drift "
        "between hypervisors of one role (once, 5 hypervisors lost their VMs' rules for a week).",
        [Variable("hypervisor", "Hypervisor", "label_values(opsloop_firewall_ports, hypervisor)")],
        [
            Panel("Unprotected VM ports", "VM ports without their security-group chain, all selected hypervisors. "
                  "Anything above 0 pages at once.",
                  [Query(f'sum(opsloop_firewall_ports{{state="unprotected", {sel}}}) or vector(0)')],
                  kind="stat", width=6, height=6, thresholds=[(1.0, "red")]),
            Panel("Hypervisors drifting", "Hypervisors whose ruleset fingerprint or package versions differ from "
                  "their role's majority.",
                  [Query(f"count(max by (hypervisor) (opsloop_firewall_drift{{{sel}}}) == 1) or vector(0)")],
                  kind="stat", width=6, height=6, thresholds=[(1.0, "orange")]),
            Panel("Coverage per hypervisor", "Share of VM ports that carry their security-group chain.",
                  [Query(f'sum by (hypervisor) (opsloop_firewall_ports{{state="protected", {sel}}}) '
                         f"/ sum by (hypervisor) (opsloop_firewall_ports{{{sel}}})", "{{hypervisor}}")],
                  unit="percentunit", kind="bargauge", max=1.0, thresholds=[(0.0, "red"), (1.0, "green")]),
            Panel("VM ports by state", "VM ports per hypervisor, protected and unprotected.",
                  [Query(f"sum by (hypervisor, state) (opsloop_firewall_ports{{{sel}}})", "{{hypervisor}} {{state}}")],
                  unit="short"),
            Panel("Drift per hypervisor", "Ruleset or package drift from the hypervisor's role (1 = drifting).",
                  [Query(f"opsloop_firewall_drift{{{sel}}} == 1")], kind="table"),
            Panel("Age of the last firewall report", "Seconds since the hypervisor's last iptables round: an old "
                  "report means the check itself stopped (the failure once went unnoticed for a week).",
                  [Query(f"time() - opsloop_firewall_report_timestamp_seconds{{{sel}}}", "{{hypervisor}}")],
                  unit="s", thresholds=[(600.0, "orange")]),
            findings_panel("firewall[.].*", f", {sel}", "firewall"),
        ])


# ---------------------------------------------------------------------------------------------- edge
def edge() -> Dashboard:
    lb = 'lb=~"$lb", server=~"$origin"'
    weight_changes = {
        "name": "Weight changes (audit trail)", "datasource": AUDIT_DATASOURCE, "enable": True,
        "iconColor": "orange", "query": 'action:edge.weights* AND mode:live', "timeField": "@timestamp",
        "textField": "reason", "tagsField": "edge",
    }
    return Dashboard(
        "opsloop-edge", "Edge weights vs demand vs capacity",
        "Per edge (load balancer) and origin: demand, the share sent to each origin, the weights in force and "
        "the origins' capacity. Orange marks: weight changes from the audit trail (Elasticsearch).",
        [Variable("lb", "Edge (load balancer)", "label_values(opsloop_lb_server_requests_per_second, lb)"),
         Variable("origin", "Origin", 'label_values(opsloop_lb_server_requests_per_second{lb=~"$lb"}, server)'),
         Variable("listener", "Listener", "label_values(opsloop_edge_fail_static, listener)")],
        [
            Panel("Demand per edge", "Requests per second through each edge's backend (the demand the controller "
                  "distributes).",
                  [Query('sum by (lb) (opsloop_lb_backend_requests_per_second{lb=~"$lb"})', "{{lb}}")], unit="reqps",
                  e2e_lb=True),
            Panel("Request rate per origin server", "Requests per second each edge sends to each origin.",
                  [Query(f"sum by (lb, server) (opsloop_lb_server_requests_per_second{{{lb}}})", "{{lb}} -> {{server}}")],
                  unit="reqps", e2e_lb=True),
            Panel("Share of each edge's traffic per origin", "Measured split of each edge's requests across origins "
                  "(what the weights achieve).",
                  [Query(f"sum by (lb, server) (opsloop_lb_server_requests_per_second{{{lb}}}) / on (lb) group_left "
                         'sum by (lb) (opsloop_lb_server_requests_per_second{lb=~"$lb"})', "{{lb}} -> {{server}}")],
                  unit="percentunit", max=1.0, e2e_lb=True),
            Panel("Load-balancer weights", "Effective weight of each origin server as the load balancer reports it "
                  "(HAProxy 0-256).",
                  [Query(f"opsloop_lb_server_weight{{{lb}}}", "{{lb}} -> {{server}}")], unit="short", e2e_lb=True),
            Panel("Load per origin vs capacity", "Requests per second reaching each origin from all edges, against "
                  "the capacity the controller plans with.",
                  [Query('opsloop:origin_requests_per_second:sum{origin=~"$origin"}', "{{origin}} load"),
                   Query('max by (origin) (opsloop_edge_origin_capacity_requests_per_second{origin=~"$origin"})', "{{origin}} capacity")],
                  unit="reqps"),
            Panel("Utilisation per origin", "Load over capacity; above 105 % for 2 minutes pages (the controller "
                  "should have shed within 3 intervals).",
                  [Query('opsloop:origin_utilisation:ratio{origin=~"$origin"}', "{{origin}}")], unit="percentunit",
                  thresholds=[(0.95, "orange"), (1.05, "red")]),
            Panel("Origin servers up", "1 while the load balancer considers the origin server UP.",
                  [Query(f"opsloop_lb_server_up{{{lb}}}", "{{lb}} -> {{server}}")], unit="bool", e2e_lb=True),
            Panel("Controller holding fail-static", "1 while the edge-weight controller holds the last good weights "
                  "because its inputs are stale.",
                  [Query('opsloop_edge_fail_static{listener=~"$listener"}', "{{listener}} {{edge}}")], unit="bool"),
            *control_loop_panels(),
        ],
        annotations=[weight_changes])


def _as_edge_origin(expr: str) -> str:
    """LB series (lb = the edge, server = the origin's server) relabelled to the controller's edge/origin."""
    return f'label_replace(label_replace({expr}, "edge", "$1", "lb", "(.*)"), "origin", "$1", "server", "(.*)")'


def control_loop_panels() -> list[Panel]:
    """The loop that changes production: what the controller decided, what the actuator applied, what the
    load balancer shows, and why (mode, stale inputs, shed demand, refusals)."""
    sel = 'listener=~"$listener", edge=~"$lb"'
    rates = 'opsloop_lb_server_requests_per_second{lb=~"$lb", server=~"$origin"}'
    edge_total = 'sum by (edge) (label_replace(opsloop_lb_server_requests_per_second{lb=~"$lb"}, "edge", "$1", "lb", "(.*)"))'
    observed = f"sum by (edge, origin) ({_as_edge_origin(rates)}) / on (edge) group_left {edge_total}"
    return [
        Panel("Share per origin: decided vs applied vs observed",
              "Per edge and listener, the share of traffic for each origin: decided = what the controller published "
              "(opsloop_edge_weight), applied = the weights the actuator wrote (opsloop_actuator_weight over their "
              "sum), observed = the split of the edge's requests the load balancer measured. Decided and applied "
              "apart: the actuator is in shadow/dry-run, refusing or failing; applied and observed apart: the "
              "load balancer does not follow its weights (health checks, sticky sessions).",
              [Query(f'opsloop_edge_weight{{{sel}, origin=~"$origin"}}', "{{edge}} {{listener}} → {{origin}} decided"),
               Query(f'opsloop_actuator_weight{{{sel}, origin=~"$origin"}} / on (edge, listener) group_left '
                     f"sum by (edge, listener) (opsloop_actuator_weight{{{sel}}})",
                     "{{edge}} {{listener}} → {{origin}} applied"),
               Query(observed, "{{edge}} → {{origin}} observed")],
              unit="percentunit", max=1.0, width=FULL_WIDTH, height=9, e2e_loop=True),
        Panel("Demand vs capacity per origin (controller's view)",
              "Per listener: the request rate each origin receives, its policy capacity, and the listener's total "
              "demand against the capacity of its healthy origins. Demand above healthy capacity is shed fairly.",
              [Query('opsloop_edge_origin_load_requests_per_second{listener=~"$listener", origin=~"$origin"}',
                     "{{listener}} {{origin}} load"),
               Query('opsloop_edge_origin_capacity_requests_per_second{listener=~"$listener", origin=~"$origin"}',
                     "{{listener}} {{origin}} capacity"),
               Query('sum by (listener) (opsloop_edge_demand_requests_per_second{listener=~"$listener"})', "{{listener}} demand"),
               Query('sum by (listener) (opsloop_edge_origin_capacity_requests_per_second{listener=~"$listener"} '
                     '* on (listener, origin) opsloop_edge_origin_healthy{listener=~"$listener"})',
                     "{{listener}} healthy capacity")],
              unit="reqps", e2e_loop=True),
        Panel("Controller mode", "1 for the mode of each listener's last decision: normal (optimal, every edge "
              "served), shed (healthy capacity short), hold (fail static: inputs stale), fallback (no usable inputs "
              "and no last good weights). The panels to the right say why.",
              [Query('opsloop_edge_mode{listener=~"$listener"} == 1', "{{listener}} {{mode}}")], unit="bool", e2e_loop=True),
        Panel("Why: input age and shed demand", "Age of the demand the last decision used (hold when older than "
              "the controller's stale_after_s) and the demand above healthy capacity (shed when above 0). The reason "
              "text of each decision is in the orange audit annotations and the open edge conditions below.",
              [Query('opsloop_edge_inputs_age_seconds{listener=~"$listener"}', "{{listener}} inputs age (s)"),
               Query('opsloop_edge_shed_requests_per_second{listener=~"$listener"}', "{{listener}} shed (req/s)")],
              unit="short", e2e_loop=True),
        Panel("Controller solve time", "Time to decide and publish one interval (median and p95 over all "
              "listeners), and intervals per second by outcome.",
              [Query(f"histogram_quantile(0.5, sum by (le) (rate(opsloop_edge_tick_seconds_bucket[{RATE}])))", "p50"),
               Query(f"histogram_quantile(0.95, sum by (le) (rate(opsloop_edge_tick_seconds_bucket[{RATE}])))", "p95")],
              unit="s", e2e_loop=True),
        Panel("Controller intervals by outcome", "Intervals the controller ran per second, by listener and outcome; "
              "publish_failed above half of them for 5 minutes pages EdgeControllerPublishFailing.",
              [Query(f'sum by (listener, outcome) (rate(opsloop_edge_ticks_total{{listener=~"$listener"}}[{RATE}]))',
                     "{{listener}} {{outcome}}")], unit="ops", e2e_loop=True),
        Panel("Actuator results and refusals", "Decisions the weight actuators handled per second by result: "
              "applied, dry_run, shadow, held (stale decision: fail static), refused (a safety rule: unknown "
              "origins, all-zero weights, an older version, clock skew), mismatch and failed.",
              [Query(f"sum by (edge, listener, result) (rate(opsloop_actuator_applies_total{{{sel}}}[{RATE}]))",
                     "{{edge}} {{listener}} {{result}}")], unit="ops", e2e_loop=True),
        Panel("Decisions refused in a row", "Decisions the actuator refused one after the other since the last one "
              "it applied (stale version, computed_at in the future, only DOWN origins). Above 0 for 2 minutes "
              "pages EdgeWeightActuatorRefusedInARow; the audit trail has each refusal's reason.",
              [Query(f"opsloop_actuator_refused_decisions{{{sel}}}", "{{edge}} {{listener}}")], unit="short",
              thresholds=[(1.0, "orange")]),
        Panel("Actuator errors", "Errors of the weight actuators per second by kind (unreachable load balancer, "
              "command failed, read-back mismatch). Above 0 for 5 minutes pages EdgeWeightActuatorErrors.",
              [Query(f'sum by (edge, kind) (rate(opsloop_actuator_errors_total{{edge=~"$lb"}}[{RATE}]))',
                     "{{edge}} {{kind}}")], unit="ops", thresholds=[(0.0001, "red")]),
        Panel("Decided vs applied version", "Version of the last decision the controller published per listener, "
              "and the version each edge's actuator applied last. An applied version that stops following the "
              "decided one means the edge holds old weights.",
              [Query('max by (listener) (opsloop_edge_decision_version{listener=~"$listener"})',
                     "{{listener}} decided"),
               Query(f"opsloop_actuator_applied_version{{{sel}}}", "{{edge}} {{listener}} applied")], unit="short", e2e_loop=True),
        Panel("Shadow diff", "Shadow mode: the fraction of traffic the latest decision would move compared with "
              "the live weights (0 = the controller agrees with what is in force). Read this before switching an "
              "edge from shadow to live.",
              [Query(f"opsloop_actuator_shadow_diff{{{sel}}}", "{{edge}} {{listener}}")],
              unit="percentunit", max=1.0, thresholds=[(0.1, "orange"), (0.3, "red")]),
        # Not findings_panel: the edge findings come from the controller and the actuators, which publish them
        # to the findings topic only; opsloop_finding_active is the stream worker's, so that table stayed empty.
        Panel("Open edge conditions", "What raises the edge findings, now: a listener shedding (mode shed: "
              "edge.capacity_shortfall) or on held or fallback weights (edge.weights_held), an edge failing static "
              "(edge.fail_static, set by its actuator or the controller). The findings themselves page through the "
              "paging actuator; no stream worker exports them as opsloop_finding_active.",
              [Query('opsloop_edge_mode{listener=~"$listener", mode!="normal"} == 1'),
               Query('max by (listener, edge) (opsloop_edge_fail_static{listener=~"$listener"}) == 1')],
              kind="table", width=FULL_WIDTH, height=7),
    ]


# ---------------------------------------------------------------------------------------------- pipeline
def pipeline() -> Dashboard:
    col = 'collector=~"$collector"'
    top = 'topic=~"$topic"'
    return Dashboard(
        "opsloop-pipeline", "Pipeline health",
        "opsloop's own health: collectors, the Kafka spool, the stream worker (throughput, lag, event age, "
        "dead letters), findings, paging and the audit trail.",
        [Variable("collector", "Collector", "label_values(opsloop_collector_rounds_total, collector)"),
         Variable("topic", "Topic", "label_values(opsloop_stream_records_total, topic)"),
         Variable("agent", "Agent", "label_values(opsloop_stream_batch_seconds_count, agent)"),
         Variable("detector", "Detector", "label_values(opsloop_findings_total, detector)"),
         # The anomaly band is drawn for one metric.field at a time, one panel per series.
         Variable("anomaly_metric", "Anomaly metric", "label_values(opsloop_anomaly_score, metric)", multi=False),
         Variable("anomaly_field", "Anomaly field",
                  'label_values(opsloop_anomaly_score{metric=~"$anomaly_metric"}, field)', multi=False),
         Variable("anomaly_series", "Anomaly series",
                  'label_values(opsloop_anomaly_score{metric=~"$anomaly_metric", field=~"$anomaly_field"}, series)')],
        [
            Panel("Scrape targets up", "1 per opsloop process Prometheus scrapes successfully.",
                  [Query('up{job="opsloop"}', "{{instance}} {{component}}")], unit="bool", e2e_lb=True),
            Panel("Samples collected per second", "Samples each collector produced per second.",
                  [Query(f"sum by (collector) (rate(opsloop_collector_samples_total{{{col}}}[{RATE}]))",
                         "{{collector}}")], unit="ops", e2e_lb=True),
            Panel("Collector errors by kind", "Per-target errors per second (timeout, auth, unreachable, parse).",
                  [Query(f"sum by (collector, kind) (rate(opsloop_collector_errors_total{{{col}}}[{RATE}]))",
                         "{{collector}} {{kind}}")], unit="ops"),
            Panel("Age of the last collection round", "Seconds since each collector finished a round.",
                  [Query(f"time() - max by (collector) (opsloop_collector_last_round_timestamp_seconds{{{col}}})",
                         "{{collector}}")], unit="s", thresholds=[(300.0, "red")], e2e_lb=True),
            Panel("Collection round duration (p95)", "95th percentile of a round's duration.",
                  [Query(f"histogram_quantile(0.95, sum by (collector, le) "
                         f"(rate(opsloop_collector_round_seconds_bucket{{{col}}}[{RATE}])))", "{{collector}}")],
                  unit="s", e2e_lb=True),
            Panel("Spool backlog", "Records waiting in the collectors' on-disk spool (Kafka unreachable) and records "
                  "dropped because the spool was full (increase of the counter over the rate interval).",
                  [Query(f"sum by (collector) (opsloop_spool_records{{{col}}})", "{{collector}} spooled"),
                   Query(f"sum by (collector) (increase(opsloop_spool_dropped_records_total{{{col}}}[{RATE}]))",
                         "{{collector}} dropped")],
                  unit="short", e2e_lb=True),
            Panel("Records consumed per topic", "Kafka records per second the stream worker consumed.",
                  [Query(f"sum by (topic) (rate(opsloop_stream_records_total{{{top}}}[{RATE}]))", "{{topic}}")],
                  unit="ops", e2e_lb=True),
            Panel("Consumer lag", "Records between the worker's position and the high-water mark, per topic.",
                  [Query(f"sum by (topic) (opsloop_stream_consumer_lag{{{top}}})", "{{topic}}")], unit="short",
                  thresholds=[(10000.0, "orange")], e2e_lb=True),
            Panel("Uncommitted records per partition",
                  "Records of each source partition beyond the group's committed offset, exported by the worker "
                  "holding it whether or not it processes batches. A line that stays above 0 while the committed "
                  "offset does not move for 10 min is a partition nobody processes (OpsloopStreamPartitionStuck).",
                  [Query(f"max by (group, topic, partition) (opsloop_stream_uncommitted_records{{{top}}})",
                         "{{group}} {{topic}}/{{partition}}")], unit="short"),
            Panel("Stream workers: partitions held and rebalances",
                  "Partitions of the selected topics each stream worker holds now, and the rebalances it went "
                  "through in the last 15 min (each one pauses every worker; more than 4 for 15 min alerts).",
                  [Query(f"count by (instance) (opsloop_stream_partition_assigned{{{top}}})", "{{instance}} partitions"),
                   Query("sum by (instance) (increase(opsloop_stream_rebalances_total[15m]))",
                         "{{instance}} rebalances/15m")], unit="short", thresholds=[(4.0, "orange")]),
            Panel("Event age", "Now minus the newest sample's event time, per topic: how stale the data is.",
                  [Query(f"max by (topic) (opsloop_stream_sample_age_seconds{{{top}}})", "{{topic}}")], unit="s",
                  e2e_lb=True),
            Panel("Batch processing time (p95)", "95th percentile of one batch's processing time per agent.",
                  [Query(f'histogram_quantile(0.95, sum by (agent, le) (rate(opsloop_stream_batch_seconds_bucket'
                         f'{{agent=~"$agent"}}[{RATE}])))', "{{agent}}")], unit="s", e2e_lb=True),
            Panel("Dead-lettered and handler errors", "Records or samples sent to the dead-letter topic, and handler "
                  "errors, per second.",
                  [Query(f"sum by (topic) (rate(opsloop_stream_deadlettered_total{{{top}}}[{RATE}]))",
                         "dead-lettered {{topic}}"),
                   Query(f'sum by (agent) (rate(opsloop_stream_errors_total{{agent=~"$agent"}}[{RATE}]))',
                         "errors {{agent}}")], unit="ops"),
            Panel("Findings published", "Finding lifecycle events (opened, updated, refreshed, cleared) per second.",
                  [Query(f'sum by (detector, event) (rate(opsloop_findings_total{{detector=~"$detector"}}[{RATE}]))',
                         "{{detector}} {{event}}")], unit="ops"),
            Panel("Open findings by severity", "Findings open now, per severity.",
                  [Query('sum by (severity) (opsloop_finding_active{detector=~"$detector"})', "{{severity}}")],
                  unit="short"),
            Panel("Paging", "Findings paged as firing alerts, alerts waiting to be delivered to Alertmanager, and "
                  "delivery failures per second (Alertmanager unreachable: retried with back-off).",
                  [Query("sum(opsloop_paging_active_alerts)", "active"),
                   Query("sum(opsloop_paging_pending_alerts)", "pending"),
                   Query(f"sum(rate(opsloop_paging_delivery_failures_total[{RATE}]))", "delivery failures/s")],
                  unit="short"),
            Panel("Finding to page (p95)", "95th percentile of the time from a finding's event time to its first "
                  "delivery to Alertmanager.",
                  [Query(f"histogram_quantile(0.95, sum by (le) "
                         f"(rate(opsloop_paging_finding_to_page_seconds_bucket[{RATE}])))", "p95")], unit="s"),
            Panel("Anomaly scores", "Highest score in [0, 1] of the streaming anomaly detector per configured "
                  "metric and field (streams.detectors.anomaly.series); 1 = far outside the learned band.",
                  [Query("max by (metric, field) (opsloop_anomaly_score)", "{{metric}}.{{field}}")],
                  unit="percentunit", max=1.0, thresholds=[(0.9, "red")]),
            Panel("Collector sends to Kafka", "Records the collectors' Kafka producers got acknowledged per second, "
                  "and failed send attempts (the records wait in the spool).",
                  [Query(f"sum by (collector) (rate(opsloop_collector_published_records_total{{{col}}}[{RATE}]))",
                         "{{collector}} acknowledged")], unit="ops", e2e_lb=True),
            Panel("Collector send failures", "Failed send attempts per second (broker unreachable); the records "
                  "wait in the spool and are re-sent.",
                  [Query(f"sum by (collector) (rate(opsloop_collector_send_failures_total{{{col}}}[{RATE}]))",
                         "{{collector}}")], unit="ops"),
            Panel("Audit trail indexing", "Audit records indexed into Elasticsearch per second by outcome, records "
                  "buffered while Elasticsearch is unreachable, and records dropped from the full buffer.",
                  [Query(f"sum by (outcome) (rate(opsloop_audit_records_total[{RATE}]))", "{{outcome}}/s"),
                   Query("sum(opsloop_audit_buffered_records)", "buffered"),
                   Query(f"sum(increase(opsloop_audit_dropped_total[{RATE}]))", "dropped")], unit="short"),
            anomaly_band_panel(),
        ])


def _fixed(colour: str) -> dict[str, Any]:
    return {"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}


def anomaly_band_panel() -> Panel:
    """Observed value inside the detector's normal band: Grafana fills from the "upper" series down to "lower"
    (fillBelowTo names one series, hence one panel per series, repeated over $anomaly_series)."""
    sel = 'metric=~"$anomaly_metric", field=~"$anomaly_field", series=~"$anomaly_series"'
    band_edge = [{"id": "custom.lineWidth", "value": 0}, _fixed("green")]
    return Panel(
        "Anomaly band: $anomaly_metric.$anomaly_field $anomaly_series",
        "The observed value of the series (opsloop_anomaly_observed) against what the streaming anomaly detector "
        "expects: the expected value (dashed) and the normal band from lower to upper (shaded). A point outside "
        "the band raises the score; a sustained one opens an anomaly finding. The band appears once the "
        "detector is warm.",
        [Query(f"max(opsloop_anomaly_observed{{{sel}}})", "observed"),
         Query(f"max(opsloop_anomaly_expected{{{sel}}})", "expected"),
         Query(f"max(opsloop_anomaly_lower{{{sel}}})", "lower"),
         Query(f"max(opsloop_anomaly_upper{{{sel}}})", "upper")],
        unit="short", width=FULL_WIDTH, repeat="anomaly_series",
        overrides=[
            {"matcher": {"id": "byName", "options": "upper"},
             "properties": [*band_edge, {"id": "custom.fillBelowTo", "value": "lower"},
                            {"id": "custom.fillOpacity", "value": 20}]},
            {"matcher": {"id": "byName", "options": "lower"}, "properties": band_edge},
            {"matcher": {"id": "byName", "options": "expected"},
             "properties": [_fixed("green"), {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]},
            {"matcher": {"id": "byName", "options": "observed"},
             "properties": [_fixed("blue"), {"id": "custom.lineWidth", "value": 2}]},
        ])


DASHBOARDS = {"power": power, "netperf": netperf, "keystone": keystone, "firewall": firewall, "edge": edge,
              "pipeline": pipeline}


def build() -> dict[str, dict[str, Any]]:
    """File name (without .json) -> dashboard JSON model."""
    return {f"opsloop-{name}": fn().to_json() for name, fn in DASHBOARDS.items()}


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


EPILOG = """examples:
  .venv/bin/python dashboards/generate.py              # write dashboards/opsloop-*.json
  .venv/bin/python dashboards/generate.py --check      # exit 1 when the committed JSON differs
  .venv/bin/python dashboards/generate.py --out /tmp/d # write elsewhere
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dashboards/generate.py", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="directory for the JSON files (default: dashboards/)")
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args(argv)
    stale = []
    for name, model in build().items():
        path = args.out / f"{name}.json"
        text = render(model)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale dashboards (run dashboards/generate.py): " + ", ".join(str(p) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
