"""Configuration of the throughput collector: target sets measured the way the source documents did it.

A *target set* is what one figure of the source documents is: N parallel TCP_STREAM streams to a set of hosts,
summed per run, repeated R times ("multi-queue virtio-net": six VMs, ten runs). Labels describe the configuration
under test (``queues: 8``, ``kernel: 4.4.0-36-generic``) and travel as tags, so a regression can be
compared like for like.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

# NoBoolNumbers: YAML reads an unquoted yes/no/on/off as a boolean, which pydantic took as the number 1 or 0
from opsloop.validation import NoBoolNumbers

Driver = Literal["netperf", "iperf3"]
DEFAULT_PORTS: dict[str, int] = {"netperf": 12865, "iperf3": 5201}
# Tags the collector sets itself; a label may not replace them.
RESERVED_TAGS = frozenset({"host", "target_set", "driver", "test", "target"})
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}$"
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9\-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9\-]{0,62}))*\.?$")


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(spec: str, default_port: int) -> Target:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address; raises ValueError naming the spec."""
    spec = spec.strip()
    host, port_text = spec, None
    if spec.startswith("["):
        end = spec.find("]")
        if end < 0:
            raise ValueError(f"target {spec!r}: unclosed '[' in IPv6 address")
        host, rest = spec[1:end], spec[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"target {spec!r}: expected ':port' after ']'")
            port_text = rest[1:]
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
    port = default_port
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"target {spec!r}: port {port_text!r} is not a number in 1..65535")
        port = int(port_text)
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        if not _HOSTNAME.match(host):
            raise ValueError(f"target {spec!r}: {host!r} is neither an IP address nor a host name") from None
    return Target(host, port)


class TargetSet(NoBoolNumbers):
    """One measurement: ``streams_per_target`` streams to every target in parallel, summed, R times."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=_NAME, description="identifies the set; the target_set tag")
    targets: list[str] = Field(min_length=1, max_length=256, description="host, host:port or [v6]:port")
    driver: Driver = "netperf"
    streams_per_target: int = Field(default=1, ge=1, le=64)
    # Whole seconds: netperf reads "-l 0.5" as "-l 0", which never ends.
    run_s: int = Field(default=10, ge=1, le=3600, description="length of one stream (netperf -l, iperf3 -t)")
    repetitions: int = Field(default=10, ge=1, le=100, description="runs per measurement (the source documents: 10)")
    min_complete_runs: int = Field(default=1, ge=1, le=100,
                                   description="complete runs needed for mean_gbps (over the targets that answered)")
    labels: dict[str, str] = Field(default_factory=dict, description="tags, e.g. queues, kernel")
    interval_s: float | None = Field(default=None, gt=0,
                                     description="measure this set at most this often (None: every round)")
    jitter_s: float = Field(default=0.0, ge=0, description="random delay added to interval_s")
    timeout_margin_s: float = Field(default=15.0, gt=0, le=600,
                                    description="a stream is killed run_s + this after it started")
    netns: str | None = Field(default=None, pattern=_NAME,
                              description="run the client inside this network namespace (ip netns exec)")
    data_port: int | None = Field(default=None, ge=1, le=65535,
                                  description="netperf: pin the remote data port; stream i uses data_port + i")
    omni_output: Literal["keyval", "csv"] = "keyval"
    min_elapsed_ratio: float = Field(default=0.9, ge=0, le=1,
                                     description="a stream that ran less than this x run_s ended early and "
                                                 "counts as failed (0: never)")

    @field_validator("labels", mode="before")
    @classmethod
    def _labels_as_text(cls, v: object) -> object:
        # YAML gives `queues: 8` as an int; tags are text.
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x))
                    if isinstance(x, (int, float, bool)) else x for k, x in v.items()}
        return v

    @field_validator("labels")
    @classmethod
    def _label_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if key in RESERVED_TAGS:
                raise ValueError(f"label {key!r} is set by the collector itself; choose another name")
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label {key!r}: use letters, digits and '_' (not starting with a digit)")
            if not value or len(value) > 200:
                raise ValueError(f"label {key!r}: value must be 1..200 characters")
        return v

    @field_validator("targets")
    @classmethod
    def _targets_parse(cls, v: list[str]) -> list[str]:
        for spec in v:
            parse_target(spec, 1)  # raises ValueError naming the bad one
        if len(set(v)) != len(v):
            raise ValueError("a target is listed twice; use streams_per_target for more streams")
        return v

    @model_validator(mode="after")
    def _driver_options(self) -> "TargetSet":
        if self.data_port is not None and self.driver != "netperf":
            raise ValueError("data_port applies to the netperf driver only")
        if self.data_port is not None and self.data_port + self.streams_per_target - 1 > 65535:
            raise ValueError("data_port + streams_per_target - 1 is above 65535")
        if self.min_complete_runs > self.repetitions:   # mean_gbps could never be reported
            raise ValueError(f"min_complete_runs ({self.min_complete_runs}) is above repetitions ({self.repetitions})")
        return self

    def parsed_targets(self) -> list[Target]:
        return [parse_target(s, DEFAULT_PORTS[self.driver]) for s in self.targets]

    @property
    def streams(self) -> int:
        """Streams (processes for netperf) running at once in one run."""
        return len(self.targets) * self.streams_per_target

    @property
    def processes(self) -> int:
        # iperf3 runs all streams to one server in one process (-P): its server takes one test at a time.
        return len(self.targets) * (self.streams_per_target if self.driver == "netperf" else 1)

    def worst_case_s(self) -> float:
        return self.repetitions * (self.run_s + self.timeout_margin_s)


class Config(NoBoolNumbers):
    """The ``collectors.netperf`` section."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field(default_factory=socket.gethostname, min_length=1, max_length=253,
                      description="the measuring host: the host tag (Kafka key)")
    target_sets: list[TargetSet] = Field(min_length=1)
    netperf_path: str = "netperf"
    iperf3_path: str = "iperf3"
    ip_path: str = "ip"
    max_processes: int = Field(default=64, ge=1, le=1024, description="tool processes alive at once")
    max_round_s: float = Field(default=900.0, gt=0, le=86400,
                               description="a round starts no run that could end after this")
    lock_file: str | None = Field(default=None, description="host-wide lock: no two collectors measure at once")

    @model_validator(mode="after")
    def _sets(self) -> "Config":
        names = [s.name for s in self.target_sets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"target_sets: duplicate name(s) {dupes}")
        for i, s in enumerate(self.target_sets):
            # Streams of one run must all run at once, or the sum would not be a parallel measurement.
            if s.processes > self.max_processes:
                raise ValueError(f"target_sets.{i} ({s.name}): {s.processes} parallel processes per run "
                                 f"exceed max_processes={self.max_processes}")
        return self

    def drivers(self) -> set[str]:
        return {s.driver for s in self.target_sets}
