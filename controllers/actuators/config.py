"""The ``controllers.actuator`` section of the opsloop config file.

    controllers:
      actuator:
        mode: live                 # live | dry-run | shadow
        max_step: 0.5              # largest share change per origin per apply
        stale_after_s: 60          # decisions older than this (computed_at) are held (fail static)
        max_clock_skew_s: 5        # decisions computed further in the future are refused
        store_dir: .run/actuator   # versioned history of applied weights (JSON lines)
        max_apply_attempts: 5      # a decision whose apply mismatches / hits a bug this often is given up
        targets:
          - {edge: ams1, listener: web, kind: haproxy, socket: /run/haproxy/admin.sock,
             backend: be_web, servers: {eu: eu1, us-east: use1}}
          - {edge: ams1, listener: app, kind: lvs, command: [/usr/sbin/ipvsadm],
             service: "tcp:192.0.2.10:443", reals: {eu: "10.0.0.1:443", us-east: "10.0.1.1:443"}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from opsloop.config import DEFAULT_RUN_DIR, LOOPBACK, Settings
from opsloop.dotted import get_dotted
from opsloop.lb.ipvs import SPEC_PROTOCOLS, RealKey, ServiceKey, parse_real_spec, parse_service_spec
from opsloop.topics import Topic
from opsloop.validation import describe_validation_error

from opsloop.controllers.actuators.mapping import HAPROXY_MAX_WEIGHT, IPVS_MAX_WEIGHT
from opsloop.controllers.edge.service.config import SECTION as EDGE, EdgeServiceSettings

SECTION = "actuator"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]*$"


class ActuatorConfigError(ValueError):
    """The actuator section is invalid; the message names the field and value."""


MAX_FWMARK = 2**32 - 1   # ipvsadm parse_fwmark: 1..UINT_MAX
SERVICE_FORMS = "tcp:VIP:PORT, udp:VIP:PORT, sctp:VIP:PORT, fwm:MARK or fwm6:MARK"


def parse_service(spec: str) -> ServiceKey:
    """A configured virtual service: the shared LB client's forms plus ``fwm6:MARK``, the IPv6 firewall-mark
    service (``ipvsadm -A -f MARK -6``, listed ``FWM  MARK IPv6``; the LVS collector's label). The kernel keys a
    mark service by (family, mark): ``fwm:MARK`` is the IPv4 one only, as ``-f MARK`` without ``-6`` is."""
    proto, sep, rest = spec.partition(":")
    proto = proto.lower()
    if proto in ("fwm", "fwm6"):
        if not (rest.isascii() and rest.isdigit()) or not 0 < int(rest) <= MAX_FWMARK:
            raise ValueError(f"virtual service {spec!r}: firewall mark must be an integer 1..{MAX_FWMARK}")
        return ServiceKey("fwm", fwmark=int(rest), family="inet6" if proto == "fwm6" else "inet")
    if not sep or proto not in SPEC_PROTOCOLS:
        raise ValueError(f"virtual service {spec!r}: expected {SERVICE_FORMS}")
    key = parse_service_spec(spec)
    _no_scope(key.address, spec, "virtual service")
    return key


def parse_real(spec: str, service: ServiceKey) -> RealKey:
    """A configured real server of ``service``: ``ADDRESS:PORT`` / ``[IPv6]:PORT``, and ``ADDRESS:0`` for a
    firewall-mark or all-port service (``ipvsadm -a -f MARK -r ADDRESS`` without a port: listed ``:0``)."""
    key = parse_real_spec(spec, service)
    _no_scope(key.address, spec, "real server")
    return key


def _no_scope(address: str, spec: str, what: str) -> None:
    # Python takes "fe80::1%eth0"; ipvsadm's inet_pton does not: every batch would fail
    if "%" in address:
        raise ValueError(f"{what} {spec!r}: ipvsadm takes no IPv6 scope id ('%...')")


class _Target(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    edge: str = Field(min_length=1, max_length=200, pattern=_NAME)
    listener: str = Field(min_length=1, max_length=200, pattern=_NAME)


class HaproxyTargetConfig(_Target):
    kind: Literal["haproxy"]
    socket: Path
    backend: str = Field(min_length=1)
    servers: dict[str, str] = Field(min_length=1)   # origin -> HAProxy server name
    weight_total: int = Field(default=HAPROXY_MAX_WEIGHT, ge=1, le=HAPROXY_MAX_WEIGHT)
    timeout_s: float = Field(default=2.0, gt=0, le=60)

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: dict[str, str]) -> dict[str, str]:
        _one_each(v, lambda server: server, "HAProxy server")
        return v


class LvsTargetConfig(_Target):
    kind: Literal["lvs"]
    command: list[str] = Field(default_factory=lambda: ["/usr/sbin/ipvsadm"], min_length=1)
    service: str                                    # tcp:VIP:PORT, udp:..., sctp:..., fwm:MARK or fwm6:MARK
    reals: dict[str, str] = Field(min_length=1)     # origin -> RIP:PORT ([v6]:PORT)
    weight_total: int = Field(default=10_000, ge=1, le=IPVS_MAX_WEIGHT)
    timeout_s: float = Field(default=5.0, gt=0, le=60)

    @field_validator("service")
    @classmethod
    def _service(cls, v: str) -> str:
        parse_service(v)
        return v

    @field_validator("reals")
    @classmethod
    def _reals(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        try:   # a service that failed its own check is reported there; its reals are read as tcp's
            service = parse_service(info.data["service"])
        except (KeyError, ValueError):
            service = ServiceKey("tcp")
        for origin, real in v.items():
            try:
                parse_real(real, service)
            except ValueError as e:
                raise ValueError(f"reals[{origin!r}]: {e}") from None
        _one_each(v, lambda real: parse_real(real, service), "real server")
        return v


def _one_each(mapping: dict[str, str], key: Callable[[str], Any], what: str) -> None:
    """Two origins on one server: the batch writes it twice and the read-back never matches."""
    seen: dict[Any, str] = {}
    for origin, name in mapping.items():
        k = key(name)
        if k in seen:
            raise ValueError(f"origins {seen[k]!r} and {origin!r} are both {what} {name!r}")
        seen[k] = origin


TargetConfig = Annotated[Union[HaproxyTargetConfig, LvsTargetConfig], Field(discriminator="kind")]


class ActuatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: Literal["live", "dry-run", "shadow"] = "live"
    max_step: float = Field(default=0.5, gt=0.0, le=1.0)
    stale_after_s: float = Field(default=60.0, gt=0)
    # a decision computed further in the future than this is refused (a controller's clock is wrong)
    max_clock_skew_s: float = Field(default=5.0, ge=0, le=3600)
    store_dir: Path = DEFAULT_RUN_DIR / "actuator"
    history_max: int = Field(default=200, ge=2, le=100_000)
    topic: str = Field(default=Topic.EDGE_WEIGHTS.value, min_length=1)
    findings_topic: str = Field(default=Topic.FINDINGS.value, min_length=1)
    group_prefix: str = Field(default="opsloop-actuator", min_length=1)
    start_offset: Literal["earliest", "latest"] = "earliest"
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    # applies of one decision that may end in a read-back mismatch or an internal error before it is given
    # up (audited failed, counted; an unreachable LB is retried without a bound: a newer decision replaces it)
    max_apply_attempts: int = Field(default=5, ge=1, le=1000)
    # re-read the LB this often and put the last applied weights back if they drifted (None: never)
    reconcile_interval_s: float | None = Field(default=30.0, gt=0)
    poll_timeout_s: float = Field(default=0.5, gt=0, le=30)
    metrics_bind: str = LOOPBACK
    metrics_port: int = Field(default=29105, ge=0, le=65535)
    targets: list[TargetConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> "ActuatorConfig":
        seen: set[tuple[str, str]] = set()
        # two listeners on one backend (one edge: one machine) would undo each other's weights every apply
        driven: dict[tuple[Any, ...], str] = {}
        for t in self.targets:
            key = (t.edge, t.listener)
            if key in seen:
                raise ValueError(f"targets: listener {t.listener!r} on edge {t.edge!r} configured twice")
            seen.add(key)
            if isinstance(t, HaproxyTargetConfig):
                lb, what = (t.edge, "haproxy", str(t.socket), t.backend), f"HAProxy backend {t.backend!r} at {t.socket}"
            else:
                lb, what = (t.edge, "lvs", parse_service(t.service)), f"virtual service {t.service!r}"
            if lb in driven:
                raise ValueError(f"targets: listeners {driven[lb]!r} and {t.listener!r} both drive {what} on edge "
                                 f"{t.edge!r}")
            driven[lb] = t.listener
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) < backoff_initial_s ({self.backoff_initial_s})")
        return self

    @classmethod
    def cross_section_errors(cls, doc: dict[str, Any]) -> list[str]:
        """Settings that contradict the edge control service's (``opsloop config check``, load).

        The controller publishes one decision per ``controllers.edge.interval_s``; an actuator whose
        ``stale_after_s`` is not above it finds every decision stale before the next one arrives and
        fails static between them (weights frozen while the controller is healthy)."""
        edge = get_dotted(doc, f"controllers.{EDGE}")
        if edge is None:
            return []
        stale = cls.model_validate(get_dotted(doc, f"controllers.{SECTION}") or {}).stale_after_s
        interval = EdgeServiceSettings.model_validate(edge).interval_s
        if stale > interval:
            return []
        return [f"controllers.{SECTION}.stale_after_s ({stale:g}) must be above controllers.{EDGE}.interval_s "
                f"({interval:g}): the controller publishes one decision per interval, so every decision would be "
                "stale before the next and the actuator would fail static between them"]

    @property
    def edges(self) -> list[str]:
        return sorted({t.edge for t in self.targets})

    def targets_for(self, edge: str) -> list[HaproxyTargetConfig | LvsTargetConfig]:
        return [t for t in self.targets if t.edge == edge]

    def target(self, edge: str, listener: str | None = None) -> HaproxyTargetConfig | LvsTargetConfig:
        matches = [t for t in self.targets_for(edge) if listener is None or t.listener == listener]
        if not matches:
            known = sorted(f"{t.edge}/{t.listener}" for t in self.targets)
            raise ActuatorConfigError(f"no actuator target for edge {edge!r}" +
                                      (f" listener {listener!r}" if listener else "") + f" (configured: {known})")
        if len(matches) > 1:
            raise ActuatorConfigError(f"edge {edge!r} has several listeners "
                                      f"{sorted(t.listener for t in matches)}; pass --listener")
        return matches[0]


def actuator_config(settings: Settings, overrides: dict[str, Any] | None = None) -> ActuatorConfig:
    doc = dict(settings.controllers.get(SECTION) or {})
    doc.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ActuatorConfig.model_validate(doc)
    except ValidationError as e:
        raise ActuatorConfigError(f"controllers.{SECTION}: {describe_validation_error(e)}") from None


__all__ = ["ActuatorConfig", "ActuatorConfigError", "HaproxyTargetConfig", "LvsTargetConfig", "actuator_config",
           "parse_real", "parse_service"]
