"""Configuration of the edge control service: the ``controllers.edge`` section and the topology file.

The topology (the "centralized source of truth" of "Building A Smarter AWS Global Accelerator") is one YAML file::

    listeners:
      - name: web                   # the listener (anycast address:port or a name)
        backend: be_web             # HAProxy backend carrying it (default: the name)
        edges:
          - {name: edge-ams, lb: ams-haproxy-1}   # lb = the collector's `host` tag (default: name)
        origins:
          - {name: near, capacity_rps: 40, healthy: true}
          - {name: far, capacity_rps: 1000}
        latency_ms:                 # edge -> origin (ms); a missing pair = no path
          edge-ams: {near: 2, far: 30}

Errors name the field and the offending value (``listeners.0.origins.1.capacity_rps: ...``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import (ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from opsloop.controllers.edge.service.token_file import MIN_TOKEN_CHARS, read_token_file
from opsloop.controllers.edge.settings import ControllerSettings
from opsloop.controllers.edge.model import Edge, Listener, Origin, Topology
from opsloop.config import DEFAULT_RUN_DIR, CollectorRuntimeSettings, ConfigError, Settings
from opsloop.dotted import get_dotted
from opsloop.validation import FloatNotBool, NoBoolNumbers, YamlFileError, describe_validation_error, read_yaml

SECTION = "edge"
TOKEN_ENV = "OPSLOOP_EDGE_API_TOKEN"
ACTUATOR = "actuator"   # controllers.actuator: its max_clock_skew_s must stay below max_epoch_ahead_s
ACTUATOR_MAX_CLOCK_SKEW_S = 5.0   # the actuators' default
# kafka_io.MAX_EPOCH_AHEAD_S (not imported: validating a config loads no Kafka client): twice the actuators' default
MAX_EPOCH_AHEAD_S = 2 * ACTUATOR_MAX_CLOCK_SKEW_S


class _Strict(NoBoolNumbers):   # `interval_s: yes` (YAML's boolean) was an interval of 1 s
    model_config = ConfigDict(extra="forbid")




class EdgeSpec(_Strict):
    name: str = Field(min_length=1, max_length=200)
    lb: str | None = Field(default=None, min_length=1, max_length=200)

    @property
    def lb_name(self) -> str:
        return self.lb or self.name


class ListenerSpec(_Strict):
    name: str = Field(min_length=1, max_length=200)
    backend: str | None = Field(default=None, min_length=1, max_length=200)
    edges: list[EdgeSpec] = Field(min_length=1)
    origins: list[Origin] = Field(min_length=1)
    # FloatNotBool: NoBoolNumbers does not look into a mapping (`{ams: {near: yes}}` was 1 ms: the nearest origin)
    latency_ms: dict[str, dict[str, FloatNotBool]] = Field(default_factory=dict)

    @property
    def backend_name(self) -> str:
        return self.backend or self.name

    def topology(self, demand_rps: dict[str, float] | None = None) -> Topology:
        """The controller's model of this listener (validates names and numbers)."""
        return Topology(listener=Listener(name=self.name, edges=[Edge(name=e.name) for e in self.edges],
                                          origins=list(self.origins)),
                        latency_ms=self.latency_ms, demand_rps=demand_rps or {})

    @model_validator(mode="after")
    def _valid(self) -> "ListenerSpec":
        self.topology()  # raises ValueError naming the field and value
        lbs = [e.lb_name for e in self.edges]
        dupes = sorted({n for n in lbs if lbs.count(n) > 1})
        if dupes:
            raise ValueError(f"edges: load balancer(s) {dupes!r} mapped to more than one edge")
        return self


class TopologySpec(_Strict):
    listeners: list[ListenerSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "TopologySpec":
        names = [lst.name for lst in self.listeners]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"listeners: duplicate name(s) {dupes!r}")
        return self

    def listener(self, name: str) -> ListenerSpec:
        for lst in self.listeners:
            if lst.name == name:
                return lst
        raise KeyError(name)


class ApiSettings(_Strict):
    bind: str = "127.0.0.1"               # loopback by default: the API changes production weights
    port: int = Field(default=29108, ge=0, le=65535)   # 0 = a free port (tests)
    token_file: Path | None = None       # else the OPSLOOP_EDGE_API_TOKEN environment variable
    enabled: bool = True


class EdgeServiceSettings(_Strict):
    interval_s: float = Field(default=15.0, gt=0, le=3600)
    topology_file: Path | None = None
    topology: TopologySpec | None = None          # inline alternative to topology_file
    metrics_bind: str = "127.0.0.1"
    metrics_port: int = Field(default=29107, ge=0, le=65535)
    api: ApiSettings = Field(default_factory=ApiSettings)
    controller: dict[str, Any] = Field(default_factory=dict)  # ControllerSettings (interval_s set from above)
    recover: bool = True                          # resume version and weights from edge.weights
    # API changes survive restarts here (an overlay on the topology file; null: not kept)
    overrides_file: Path | None = DEFAULT_RUN_DIR / "edge" / "overrides.json"
    publish_findings: bool = True
    # restart recovery continues from no epoch further than this ahead of this host's clock (kafka_io.py); must stay
    # above the actuators' max_clock_skew_s (twice it by default): an epoch they took but this instance did not
    # chase leaves its own below it, every decision refused for good
    max_epoch_ahead_s: float = Field(default=MAX_EPOCH_AHEAD_S, gt=0, le=7200)

    @field_validator("controller")
    @classmethod
    def _controller(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # checked here, not in the model's own check: its errors then carry their path under `controller`
        # (a bad max_step was reported at controllers.edge.max_step, a setting that does not exist)
        interval = {"interval_s": info.data["interval_s"]} if "interval_s" in info.data else {}
        ControllerSettings.model_validate({**v, **interval})
        return v

    @model_validator(mode="after")
    def _one_topology(self) -> "EdgeServiceSettings":
        if (self.topology is None) == (self.topology_file is None):
            raise ValueError("exactly one of topology_file and topology must be set")
        return self

    def controller_settings(self) -> ControllerSettings:
        return ControllerSettings.model_validate({**self.controller, "interval_s": self.interval_s})

    @classmethod
    def cross_section_errors(cls, doc: dict[str, Any]) -> list[str]:
        """Settings that contradict the collectors' (``opsloop config check``, load).

        Demand is measured once per collection (``collector.interval_s``, plus up to ``jitter_s``) and
        stamped with its time: a ``controller.stale_after_s`` not above that turns every measurement
        stale before the next one and the controller holds (fail static) between them."""
        service = cls.model_validate(get_dotted(doc, f"controllers.{SECTION}") or {})
        errors: list[str] = []
        stale = service.controller_settings().stale_after_s
        collector = CollectorRuntimeSettings.model_validate(doc.get("collector") or {})
        every = collector.interval_s + collector.jitter_s
        if stale <= every:
            jitter = f" + collector.jitter_s ({collector.jitter_s:g})" if collector.jitter_s else ""
            errors.append(f"controllers.{SECTION}.controller.stale_after_s ({stale:g}) must be above "
                          f"collector.interval_s ({collector.interval_s:g}){jitter}: demand is measured once per "
                          "collection, so every measurement would be stale before the next and the controller would "
                          "hold between them")
        actuator = get_dotted(doc, f"controllers.{ACTUATOR}")
        # no actuator section here (configured on the edge hosts): nothing to compare with
        skew = actuator.get("max_clock_skew_s", ACTUATOR_MAX_CLOCK_SKEW_S) if isinstance(actuator, dict) else None
        if isinstance(skew, (int, float)) and skew >= service.max_epoch_ahead_s:
            errors.append(f"controllers.{SECTION}.max_epoch_ahead_s ({service.max_epoch_ahead_s:g}) must be above "
                          f"controllers.{ACTUATOR}.max_clock_skew_s ({skew:g}; twice it is the safe margin): a "
                          "restarted controller would not continue from an epoch the actuators took, and they "
                          "would refuse every decision it makes")
        return errors


def load_topology(path: str | Path) -> TopologySpec:
    p = Path(path)
    try:   # the shared reader: not UTF-8 was a traceback, a YAML error PyYAML's multi-line message
        doc = read_yaml(p)
    except YamlFileError as e:
        raise ConfigError(f"topology file {p}: {e}") from None
    if not isinstance(doc, dict):   # a list's items were quoted whole in pydantic's message
        raise ConfigError(f"topology file {p}: " + ("empty" if doc is None else
                                                    f"top level must be a mapping, got {type(doc).__name__}"))
    try:
        return TopologySpec.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(f"topology file {p}: {describe_validation_error(e)}") from None


def service_settings(settings: Settings) -> EdgeServiceSettings:
    try:
        return EdgeServiceSettings.model_validate(settings.controllers.get(SECTION) or {})
    except ValidationError as e:
        raise ConfigError(f"controllers.{SECTION}: {describe_validation_error(e)}") from None


def topology_path(cfg: EdgeServiceSettings, base: Path | None = None) -> Path | None:
    """The topology file as the service reads it (relative to the config file's directory), None when inline."""
    if cfg.topology_file is None:
        return None
    return cfg.topology_file if cfg.topology_file.is_absolute() or base is None else base / cfg.topology_file


def resolve_topology(cfg: EdgeServiceSettings, base: Path | None = None) -> TopologySpec:
    if cfg.topology is not None:
        return cfg.topology
    path = topology_path(cfg, base)
    assert path is not None
    return load_topology(path)


def read_token(api: ApiSettings) -> str:
    """The API bearer token (file first, then environment); never logged."""
    if api.token_file is not None:   # the service's own reader (TokenFileError is a ConfigError)
        return read_token_file(api.token_file)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"controllers.edge.api: the bearer token from environment variable {TOKEN_ENV} is missing "
                          f"or shorter than {MIN_TOKEN_CHARS} characters")
    return token
