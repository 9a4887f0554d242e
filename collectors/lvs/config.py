"""Configuration of the LVS request-rate collector (the ``collectors.lvs`` section)."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import ConfigDict, Field, model_validator

# NoBoolNumbers: YAML reads an unquoted yes/no/on/off as a boolean, which pydantic took as the number 1 or 0
from opsloop.validation import NoBoolNumbers


class Config(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    host: str = Field(default_factory=lambda: socket.gethostname().split(".")[0] or "localhost",
                      min_length=1, max_length=253, pattern=r"^[A-Za-z0-9_.:-]+$")
    # Any source can be switched off with null; tests point them at recorded output.
    proc_ip_vs: Path | None = Path("/proc/net/ip_vs")
    proc_ip_vs_stats: Path | None = Path("/proc/net/ip_vs_stats")
    # ipvsadm prints --stats or --rate columns, not both: two listings.
    ipvsadm_stats_command: list[str] | None = Field(
        default_factory=lambda: ["ipvsadm", "-Ln", "--stats", "--exact"], min_length=1)
    ipvsadm_rate_command: list[str] | None = Field(
        default_factory=lambda: ["ipvsadm", "-Ln", "--rate", "--exact"], min_length=1)
    timeout_s: float = Field(default=5.0, gt=0, le=120)

    @model_validator(mode="after")
    def _some_source(self) -> "Config":
        if not any((self.proc_ip_vs, self.proc_ip_vs_stats, self.ipvsadm_stats_command, self.ipvsadm_rate_command)):
            raise ValueError("all sources are disabled: set at least one of proc_ip_vs, proc_ip_vs_stats, "
                             "ipvsadm_stats_command, ipvsadm_rate_command")
        return self
