"""A Keystone whose latency moves to a new steady level (its database moved) and stays there: the regime finding
opens, and once the level has held for REGIME_ACCEPT_S it is the norm: the finding clears, and the next move from
it (the token cache lost, ~40 ms -> ~600 ms, the source's uncached regime) pages anew.

Before, the finding stayed open for good (the fastest regime ever seen stayed the reference), the backstop alert
with it, and the move to 600 ms was only a refresh of that finding: no new page for the incident that mattered.
Driven through the real handler, its state round-tripped as the changelog carries it (JSON)."""

from __future__ import annotations

import orjson

from opsloop.records import metric
from opsloop.streams.detectors.keystone.detector import REGIME, REGIME_ACCEPT_S
from opsloop.streams.detectors.keystone.handler import KeystoneHandler
from tests.helpers import unique

STEP = 120.0   # a collector round every two minutes
T0 = 1_795_300_000.0


class Probe:
    def __init__(self) -> None:
        self.host = unique("ks-regime")
        self.h = KeystoneHandler()
        self.t = T0

    def rounds(self, p50_ms: float, seconds: float) -> list[tuple[str, float, str]]:
        """Probe rounds at ``p50_ms`` for ``seconds``; the regime finding's events (heartbeats left out)."""
        end = self.t + seconds
        while self.t < end:
            self.t += STEP
            self.h.handle([metric("keystone_probe", {"count": 5.0, "p50_ms": p50_ms, "p95_ms": p50_ms * 1.2,
                                                     "max_ms": p50_ms * 1.5, "errors": 0.0},
                                  {"host": self.host, "probe": "token_validate"}, self.t)], self.t)
        return [(e, f.last_seen, f.explanation) for e, f in self.h.drain_outbox()
                if f.detector == REGIME and e != "refreshed"]

    def restart(self) -> None:
        fresh = KeystoneHandler(self.h.settings, self.h.refresh_s)
        fresh.restore({self.host: orjson.loads(orjson.dumps(self.h.state_of(self.host)))})
        self.h = fresh

    def open(self) -> list[str]:
        return [f.detector for f in self.h.open_findings() if f.detector == REGIME]


def test_a_new_steady_level_opens_then_becomes_the_norm_and_the_next_move_pages_again() -> None:
    p = Probe()
    assert p.rounds(10.0, 7200) == []
    [(event, opened_at, _)] = p.rounds(40.0, 3600)            # the database moved: 4x slower, for good
    assert event == "opened"
    assert p.rounds(40.0, REGIME_ACCEPT_S / 2) == []
    p.restart()                                                # the slow regime's clock survives a restart
    events = p.rounds(40.0, REGIME_ACCEPT_S / 2)
    [(event, cleared_at, why)] = events
    assert event == "cleared" and "accepted as the new norm" in why and "was ~10 ms" in why, events
    assert opened_at + REGIME_ACCEPT_S <= cleared_at < opened_at + REGIME_ACCEPT_S + STEP
    assert p.open() == []
    assert p.rounds(40.0, 7200) == []                          # the norm now: quiet
    [(event, _, why)] = p.rounds(600.0, 3600)                  # then the token cache is lost
    assert event == "opened" and "~40 ms before" in why, "before: no new page, the old finding refreshed"
    [(event, _, why)] = p.rounds(40.0, 3600)                   # cache back
    assert event == "cleared" and "back to" in why


def test_a_level_that_moves_on_restarts_its_clock_and_a_return_clears_at_once() -> None:
    p = Probe()
    p.rounds(10.0, 7200)
    assert [e for e, _, _ in p.rounds(40.0, REGIME_ACCEPT_S - 3600)] == ["opened"]
    # worse before the day is over: a new regime, its own day to become the norm (still the same page)
    assert p.rounds(600.0, REGIME_ACCEPT_S - 3600) == [] and p.open() == [REGIME]
    [(event, _, why)] = p.rounds(10.0, 3600)
    assert event == "cleared" and "back to" in why
    # the nightly peak (an hour, docs/sources.md) opens and clears, never becomes the norm
    assert [e for e, _, _ in p.rounds(60.0, 3600) + p.rounds(10.0, 3600)] == ["opened", "cleared"]
