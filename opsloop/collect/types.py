"""What a collector is, as the runtime sees it.

A collector is an object with a ``name`` and a ``collect()`` method that performs one round
(reads every target once, bounded in time by the collector itself) and returns a :class:`Round`:
the samples it read and one :class:`CollectError` per target that failed. A failing target never
fails the round; ``collect()`` raises only when nothing at all could be attempted (e.g. the tool
is not installed), and then with :class:`CollectorUnavailable` and a message that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from opsloop.records import Metric

# Error kinds shared by collectors, used as the `kind` label of opsloop_collector_errors_total.
ERROR_KINDS = (
    "unreachable",     # target did not answer (timeout, connection refused)
    "timeout",         # the tool ran past its deadline and was killed
    "auth",            # authentication or authorisation failed
    "unsupported",     # the target does not support the command (e.g. no DCMI)
    "no_reading",      # a sensor exists but has no reading
    "parse",           # the tool's output did not parse (the error keeps its first bytes)
    "permission",      # we lack a privilege (e.g. CAP_NET_ADMIN for iptables)
    "tool",            # the tool failed in another way (non-zero exit, missing binary)
)


@dataclass(slots=True)
class CollectError:
    target: str
    kind: str
    message: str

    def __post_init__(self) -> None:
        if self.kind not in ERROR_KINDS:
            raise ValueError(f"unknown error kind {self.kind!r}; one of {ERROR_KINDS}")


@dataclass(slots=True)
class Round:
    metrics: list[Metric] = field(default_factory=list)
    errors: list[CollectError] = field(default_factory=list)


class CollectorUnavailable(RuntimeError):
    """Nothing can be collected at all (missing binary, missing privilege). Message says what to do."""


@runtime_checkable
class Collector(Protocol):
    name: str

    def collect(self) -> Round: ...
