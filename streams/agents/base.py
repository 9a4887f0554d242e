"""What every detector agent shares: the handler contract and its bookkeeping.

A handler is plain Python (no I/O, no awaits), like the runtime's batch handlers: ``handle(metrics,
now)`` feeds one batch of valid samples to its detectors. On top of that, a *detector* handler
keeps its state per **state key** (a series, a hypervisor, a host ...) so that the agent loop
(:mod:`streams.agents.stateful`) can persist exactly the keys a batch changed into a Faust table,
and restore them after a restart or rebalance:

* ``touched()``: the keys changed since the last call (what the loop writes, once per batch);
* ``state_of(key)``: the JSON-able state of one key (None: delete it);
* ``restore(states)``: replace the in-memory state with what the table holds;
* ``drain_outbox()``: (event, finding) pairs for the findings sink (see ``FindingBook``).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from opsloop.findings import Finding
from opsloop.log import get_logger
from opsloop.wire import Metric, Topic
from streams.detectors.findingbook import FindingBook

log = get_logger("stream.agents")

Publication = tuple[str, Finding]   # (event: opened/updated/refreshed/cleared, finding)


def number(fields: Mapping[str, Any], *names: str) -> float | None:
    """The first of ``names`` that is a real number in ``fields`` (bools are not numbers here)."""
    for n in names:
        v = fields.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


class DetectorHandler:
    """Base class: subclasses implement ``process``, ``books``, ``state_of``, ``restore_key``."""

    name: str = "detector"
    topics: tuple[Topic, ...] = ()

    def __init__(self) -> None:
        self._touched: set[str] = set()
        self._outbox: list[Publication] = []
        self.rejected = 0   # samples of the right name that an adapter could not read

    # ---------------------------------------------------------------- the contract (agent loop)
    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        self.process(metrics, now)
        for book in self.books():
            for event, finding in book.drain():
                self._outbox.append((event, finding))
                key = self.key_of_finding(finding)
                if key is not None:
                    self._touched.add(key)

    def touched(self) -> set[str]:
        out, self._touched = self._touched, set()
        return out

    def drain_outbox(self) -> list[Publication]:
        out, self._outbox = self._outbox, []
        return out

    def open_findings(self) -> list[Finding]:
        return [f for book in self.books() for f in book.open_findings()]

    def restore(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace all in-memory state with ``states`` (key -> state_of(key) as stored)."""
        self.reset()
        for key, state in states.items():
            try:
                self.restore_key(key, state)
            except (KeyError, TypeError, ValueError) as e:
                # A state written by an incompatible version: start that key afresh, say so.
                log.error("state_restore_failed", handler=self.name, key=key, error=f"{type(e).__name__}: {e}")
        self.after_restore()

    # ---------------------------------------------------------------------- for subclasses
    def process(self, metrics: Sequence[Metric], now: float) -> None:
        raise NotImplementedError

    def books(self) -> Iterable[FindingBook]:
        raise NotImplementedError

    def key_of_finding(self, finding: Finding) -> str | None:
        raise NotImplementedError

    def state_of(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def restore_key(self, key: str, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def after_restore(self) -> None:
        """Hook: refresh derived gauges once every key is back."""

    def touch(self, key: str) -> None:
        self._touched.add(key)
