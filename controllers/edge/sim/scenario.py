"""The scenario file of ``opsloop sim``: its schema (origins, edges, events, the controllers to
run, their settings and the targets), validation with errors naming the file and the field, and the
controller kinds a scenario may name."""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import (AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from opsloop.controllers.edge.settings import ControllerSettings, FixedStepSettings
from opsloop.controllers.edge.model import MAX_CAPACITY_RPS, MAX_LATENCY_MS
from opsloop.validation import FloatNotBool, IntNotBool, YamlFileError, error_lines, read_yaml, refuse_bool

# "fixed-step-headroom": the fixed-step baseline planned with our controller's headroom, so a
# comparison does not credit the headroom alone
CONTROLLER_KINDS = ("ours", "fixed-step", "fixed-step-headroom", "undamped")
KIND_ALIASES = {"seed": "fixed-step"}  # an older name of the 2 %-per-interval baseline, still accepted
BASELINES = ("fixed-step", "fixed-step-headroom")


def canonical_kind(kind: str) -> str:
    return KIND_ALIASES.get(kind, kind)



class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the field."""


# a number of the scenario, never a boolean: `capacity_rps: yes` (or `on`, YAML 1.1 booleans) ran with 1 req/s
Num = FloatNotBool
Count = IntNotBool


# Sane ranges of a scenario's numbers: `demand_scale: 1e308` made every figure of the run NaN. A rate (demand,
# capacity) is bounded as in a topology file, a latency or service time as a topology's latency (inf: no path).
MAX_RPS = MAX_CAPACITY_RPS
MAX_DEMAND_SCALE = 1000.0            # one event's factor
MAX_IMPLIED_RPS = 1e15               # an edge's demand after every event's factors (they compound)
MAX_TIME_S = 86_400.0                # a ramp, a stale spell, a delay: at most the longest run
MAX_INTERVAL_S = 3600.0              # as controllers.edge.interval_s
MAX_SEED = 2 ** 63 - 1               # numpy refuses a negative seed: was a traceback at the run


class SimOrigin(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    capacity_rps: Num = Field(ge=0.0, le=MAX_RPS)
    service_ms: Num = Field(default=10.0, ge=0.0, le=MAX_LATENCY_MS)
    healthy: bool = True


class SimEdge(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    base_rps: Num = Field(ge=0.0, le=MAX_RPS, allow_inf_nan=False)
    elasticity: Num = Field(default=1.0, ge=0.0, le=4.0, allow_inf_nan=False)
    latency_ms: dict[str, Num]
    initial_weights: dict[str, Num] | None = None


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at: Num = Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)
    label: str = ""
    demand: dict[str, Num] | None = None            # edge -> new base_rps
    # one factor for every edge's base_rps, or a factor per edge
    demand_scale: float | dict[str, float] | None = None
    ramp_s: Num | None = Field(default=None, gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)  # demand change spread over
    capacity: dict[str, Num] | None = None          # origin -> new capacity_rps
    health: dict[str, bool] | None = None             # origin -> healthy
    latency: dict[str, dict[str, Num]] | None = None  # edge -> origin -> ms
    stale_for_s: Num | None = Field(default=None, gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)

    @field_validator("demand_scale", mode="before")
    @classmethod
    def _one_factor_or_mapping(cls, value: Any) -> Any:
        # one error line, not one per member of the union ("function-before[refuse_bool(), float]: …")
        if isinstance(value, dict):
            for edge, factor in value.items():
                if isinstance(factor, bool):
                    raise ValueError(f"{edge}: expected a number, not a boolean (YAML reads unquoted "
                                     "yes/no/on/off as true/false)")
        if value is None or isinstance(value, dict):
            return value
        refuse_bool(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError("expected a factor, or a mapping of edge to factor") from None

    @property
    def changes_plant(self) -> bool:
        return any(v is not None for v in (self.demand, self.demand_scale, self.capacity,
                                           self.health, self.latency))


class Targets(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)   # a NaN target fails every run

    tolerance: Num = Field(default=0.05, ge=0.0, le=1.0)   # fractions of capacity or of traffic
    capacity_within_intervals: Num = Field(default=3.0, gt=0.0, le=1000.0)
    overshoot: Num = Field(default=0.05, ge=0.0, le=1.0)
    oscillation_weight: Num = Field(default=0.03, ge=0.0, le=1.0)
    oscillation_load: Num = Field(default=0.05, ge=0.0, le=1.0)
    settle_band: Num = Field(default=0.02, gt=0.0, le=1.0)
    steady_intervals: Count = Field(default=4, ge=2, le=10_000)
    # 95th percentile of the excess over capacity outside the transients after a step (noise, flaps)
    excess_p95: Num = Field(default=0.05, ge=0.0, le=1.0)
    churn: Num = Field(default=0.03, ge=0.0, le=1.0)        # mean traffic share moved per interval
    # against the fixed-step baselines of the same run (with and without our headroom):
    overload_ratio: Num = Field(default=0.10, ge=0.0, le=100.0)  # overload-seconds ≤ ratio × baseline's …
    overload_slack_s: Num = Field(default=0.0, ge=0.0, le=MAX_TIME_S)  # … + this (a baseline with ~0 overload)
    latency_ratio: Num = Field(default=1.10, gt=0.0, le=100.0)   # mean latency ≤ ratio × baseline's


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1)
    description: str = ""
    listener: str = "listener"
    interval_s: Num = Field(default=15.0, gt=0.0, le=MAX_INTERVAL_S)
    duration_s: Num = Field(default=600.0, gt=0.0, le=MAX_TIME_S)
    dt_s: Num = Field(default=1.0, gt=0.0, le=MAX_INTERVAL_S)
    seed: Count = Field(default=0, ge=0, le=MAX_SEED)
    noise: Num = Field(default=0.0, ge=0.0, le=0.5)
    client_tau_s: Num = Field(default=2.0, ge=0.0, le=MAX_INTERVAL_S)
    overload_slowdown: Num = Field(default=1.0, ge=0.0, le=1000.0)   # service time x (1 + this x overload)
    # true demand noise (what clients send, unlike ``noise`` which only blurs the measurement):
    # every edge's base rate × (1 + demand_noise·N(0,1)), redrawn every demand_noise_period_s
    demand_noise: Num = Field(default=0.0, ge=0.0, le=0.5)
    demand_noise_period_s: Num | None = Field(default=None, gt=0.0, le=MAX_TIME_S)
    health_detection_delay_s: Num = Field(default=0.0, ge=0.0, le=MAX_TIME_S)
    origins: list[SimOrigin] = Field(min_length=1)
    edges: list[SimEdge] = Field(min_length=1)
    events: list[Event] = Field(default_factory=list)
    controllers: list[str] = Field(default_factory=lambda: ["ours", "fixed-step"], min_length=1)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    # settings of the fixed-step baseline (``seed_controller``: its older key, still accepted)
    fixed_step: FixedStepSettings = Field(default_factory=FixedStepSettings,
                                          validation_alias=AliasChoices("fixed_step", "seed_controller"))
    targets: Targets = Field(default_factory=Targets)

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        origins = [o.name for o in self.origins]
        edges = [e.name for e in self.edges]
        for kind, names in (("origins", origins), ("edges", edges)):
            if len(set(names)) != len(names):
                raise ValueError(f"{kind}: duplicate names in {names!r}")
            seen: dict[str, str] = {}
            for name in names:
                # the table, the reasons and the plot print names: two that print alike ("café" composed and
                # decomposed, "us" and "us ") or a blank one could not be told apart there
                key = unicodedata.normalize("NFC", name).strip()
                if not key or any(unicodedata.category(c) == "Cc" for c in name):
                    raise ValueError(f"{kind}: name {name!r} is blank or holds a control character")
                if key in seen:
                    raise ValueError(f"{kind}: names {seen[key]!r} and {name!r} print alike (Unicode NFC, "
                                     "spaces around)")
                seen[key] = name
        if self.duration_s < self.interval_s:   # the controllers would never act; a verdict would mean nothing
            raise ValueError(f"duration_s: {self.duration_s!r} is shorter than one control interval "
                             f"(interval_s {self.interval_s!r})")
        if self.duration_s < 2 * self.interval_s - 1e-9:   # the one tick is at the end: its weights never apply
            raise ValueError(f"duration_s: {self.duration_s!r} is under two control intervals (interval_s "
                             f"{self.interval_s!r}): the first decision would never take effect")
        steps = self.interval_s / self.dt_s
        if abs(steps - round(steps)) > 1e-9:
            raise ValueError(f"interval_s: must be a multiple of dt_s ({self.dt_s!r}), "
                             f"got {self.interval_s!r}")
        steps = self.duration_s / self.dt_s   # the plant runs whole steps: 100.5 s at dt 1 ran 100 s
        if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
            raise ValueError(f"duration_s: must be a multiple of dt_s ({self.dt_s!r}), "
                             f"got {self.duration_s!r}")

        def check_latency(where: str, row: dict[str, float]) -> None:
            for origin, ms in row.items():
                if origin not in origins:
                    raise ValueError(f"{where}: unknown origin {origin!r} (origins: {origins})")
                if not isinstance(ms, (int, float)) or math.isnan(ms) or ms < 0:
                    raise ValueError(f"{where}[{origin!r}]: expected latency >= 0 ms, got {ms!r}")
                if math.isfinite(ms) and ms > MAX_LATENCY_MS:   # .inf is no path; a finite one is bounded
                    raise ValueError(f"{where}[{origin!r}]: {ms!r} ms is above {MAX_LATENCY_MS:g} ms "
                                     "(write .inf for no path)")

        for edge in self.edges:
            check_latency(f"edges[{edge.name!r}].latency_ms", edge.latency_ms)
            if not any(math.isfinite(v) for v in edge.latency_ms.values()):
                raise ValueError(f"edges[{edge.name!r}].latency_ms: no reachable origin")
            if edge.initial_weights is not None:
                for origin, share in edge.initial_weights.items():
                    if origin not in origins:
                        raise ValueError(f"edges[{edge.name!r}].initial_weights: unknown origin "
                                         f"{origin!r}")
                    if not isinstance(share, (int, float)) or not 0 <= share <= 1:
                        raise ValueError(f"edges[{edge.name!r}].initial_weights[{origin!r}]: "
                                         f"share must be in [0, 1], got {share!r}")
                    # no path (not in latency_ms, or .inf): that share failed every request from t=0 on
                    if share > 0 and not math.isfinite(edge.latency_ms.get(origin, math.inf)):
                        raise ValueError(f"edges[{edge.name!r}].initial_weights[{origin!r}]: no path to "
                                         f"that origin (not in latency_ms or .inf)")
                if sum(edge.initial_weights.values()) <= 0:
                    raise ValueError(f"edges[{edge.name!r}].initial_weights: all zero")
        for i, ev in enumerate(self.events):
            where = f"events[{i}] (at {ev.at})"
            if ev.at > self.duration_s:
                raise ValueError(f"{where}.at: after duration_s {self.duration_s!r}")
            for key in ("demand", "demand_scale", "capacity", "health", "latency"):
                if getattr(ev, key) == {}:   # counted as a change: a phase of its own that changes nothing
                    raise ValueError(f"{where}.{key}: empty (name at least one "
                                     f"{'origin' if key in ('capacity', 'health') else 'edge'})")
            if isinstance(ev.demand_scale, dict):
                for edge, factor in ev.demand_scale.items():
                    if edge not in edges:
                        raise ValueError(f"{where}.demand_scale: unknown edge {edge!r} (edges: {edges})")
                    if not isinstance(factor, (int, float)) or not 0 <= factor <= MAX_DEMAND_SCALE:
                        raise ValueError(f"{where}.demand_scale[{edge!r}]: expected a factor in "
                                         f"[0, {MAX_DEMAND_SCALE:g}], got {factor!r}")
            elif ev.demand_scale is not None and not 0 <= ev.demand_scale <= MAX_DEMAND_SCALE:
                raise ValueError(f"{where}.demand_scale: expected a factor in [0, {MAX_DEMAND_SCALE:g}], "
                                 f"got {ev.demand_scale!r}")
            if ev.ramp_s is not None and ev.demand is None and ev.demand_scale is None:
                raise ValueError(f"{where}.ramp_s: only ramps a demand change (give demand or "
                                 f"demand_scale)")
            for edge in (ev.demand or {}):
                if edge not in edges:
                    raise ValueError(f"{where}.demand: unknown edge {edge!r} (edges: {edges})")
            for edge, rps in (ev.demand or {}).items():
                if not isinstance(rps, (int, float)) or not 0 <= rps <= MAX_RPS:
                    raise ValueError(f"{where}.demand[{edge!r}]: expected req/s in [0, {MAX_RPS:g}], got {rps!r}")
            for origin, cap in (ev.capacity or {}).items():
                if origin not in origins:
                    raise ValueError(f"{where}.capacity: unknown origin {origin!r}")
                if not isinstance(cap, (int, float)) or not 0 <= cap <= MAX_RPS:
                    raise ValueError(f"{where}.capacity[{origin!r}]: expected req/s in [0, {MAX_RPS:g}], "
                                     f"got {cap!r}")
            for origin in (ev.health or {}):
                if origin not in origins:
                    raise ValueError(f"{where}.health: unknown origin {origin!r}")
            for edge, row in (ev.latency or {}).items():
                if edge not in edges:
                    raise ValueError(f"{where}.latency: unknown edge {edge!r}")
                check_latency(f"{where}.latency[{edge!r}]", row)
            if not ev.changes_plant and ev.stale_for_s is None:
                raise ValueError(f"{where}: changes nothing (give demand, demand_scale, capacity, "
                                 f"health, latency or stale_for_s)")
        _check_implied_demand(self)
        for kind in self.controllers:
            if canonical_kind(kind) not in CONTROLLER_KINDS:
                raise ValueError(f"controllers: unknown controller {kind!r} "
                                 f"(known: {', '.join(CONTROLLER_KINDS)})")
        return self


def scenario_warnings(scn: Scenario) -> list[str]:
    """What a valid scenario holds that has no effect on the run: said, not silently dropped."""
    out = [f"events[{i}] (at {ev.at:g}): at the end of the run (duration_s {scn.duration_s:g}): never takes effect"
           for i, ev in enumerate(scn.events) if ev.at >= scn.duration_s]
    if scn.demand_noise_period_s is not None and scn.demand_noise == 0:
        # it only paces demand_noise (``noise`` is the measurement's): alone it did nothing, without a word
        out.append("demand_noise_period_s: has no effect without demand_noise > 0")
    for key, section in (("controller", scn.controller), ("fixed_step", scn.fixed_step)):
        # the simulator paces every controller at the scenario's interval_s: `controller: {interval_s: 30}` at
        # a scenario interval of 15 s ran at 15 s without a word
        if "interval_s" in section.model_fields_set and section.interval_s != scn.interval_s:
            out.append(f"{key}.interval_s: ignored ({section.interval_s:g}): every controller runs at the "
                       f"scenario's interval_s ({scn.interval_s:g})")
    return out


def _check_implied_demand(scn: Scenario) -> None:
    """Each event's factor is bounded, but factors compound (the plant scales the demand in force): an
    edge's demand through the events, in the order the plant applies them, stays below MAX_IMPLIED_RPS."""
    demand = {e.name: e.base_rps for e in scn.edges}
    for i, ev in sorted(enumerate(scn.events), key=lambda item: item[1].at):
        for edge in demand:
            if isinstance(ev.demand_scale, dict):
                demand[edge] *= ev.demand_scale.get(edge, 1.0)
            elif ev.demand_scale is not None:
                demand[edge] *= ev.demand_scale
            demand[edge] = (ev.demand or {}).get(edge, demand[edge])
            if demand[edge] > MAX_IMPLIED_RPS:
                raise ValueError(f"events[{i}] (at {ev.at}).demand_scale: the demand of edge {edge!r} grows to "
                                 f"{demand[edge]:.3g} req/s (at most {MAX_IMPLIED_RPS:g})")


MAX_SIM_STEPS = 1_000_000   # a day at 0.1 s steps is 864,000


def _hint(exc: ValidationError) -> str:
    """What a name that is not a string most likely is: an unquoted no/yes/on/off or number."""
    for err in exc.errors(include_url=False):
        if err.get("type") == "string_type" and isinstance(err.get("input"), (bool, int, float)):
            return ("; YAML reads an unquoted no, yes, on, off or number as a boolean or a number: "
                    "quote such a name (\"no\")")
    return ""


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file; errors name the file and the field."""
    path = Path(path)
    try:   # the shared reader: not UTF-8 was a traceback, a YAML error PyYAML's multi-line message, a key
        doc = read_yaml(path)   # given twice (PyYAML keeps the last) is refused there
    except YamlFileError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{path}: " + ("empty" if doc is None else
                                          f"expected a mapping at the top level, got {type(doc).__name__}"))
    try:
        scn = Scenario.model_validate(doc)
    except ValidationError as exc:   # a check across fields quoted the whole document after "got"
        # a check across fields names its own field: "(top level): " before it only hid the name
        lines = [line.removeprefix("(top level): ") for line in error_lines(exc)]
        raise ScenarioError(f"{path}: {'; '.join(lines)}{_hint(exc)}") from None
    # The plant keeps arrays of one row per step: dt_s 1e-9 over 60 s asked numpy for 447 GiB (a traceback).
    if scn.duration_s / scn.dt_s > MAX_SIM_STEPS:
        raise ScenarioError(f"{path}: dt_s: {scn.dt_s!r} makes {scn.duration_s / scn.dt_s:.3g} simulation steps "
                            f"over duration_s {scn.duration_s:g} (at most {MAX_SIM_STEPS:,})")
    return scn
