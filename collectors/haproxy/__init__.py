"""HAProxy request-rate collector: ``show stat`` over the runtime API (signal 5, live load balancer)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from opsloop.collectors.haproxy.collector import HaproxyCollector
# NoBoolNumbers: `timeout_s: yes` (YAML's boolean) was a time-out of 1 s
from opsloop.validation import NoBoolNumbers


class Config(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # load balancer name (the `host` tag, Kafka key) -> admin socket path; at least one: without a
    # target a round would print nothing and look like success
    instances: dict[str, str] = Field(min_length=1)
    timeout_s: float = Field(default=2.0, gt=0, le=60)
    # Only these proxies (frontends/backends); empty = all.
    proxies: list[str] = Field(default_factory=list)


def build(config: Config) -> HaproxyCollector:
    return HaproxyCollector(config.instances, config.timeout_s, config.proxies)


__all__ = ["Config", "HaproxyCollector", "build"]
