"""A Keystone host's stored state stays bounded and is one its restore takes back, whatever the samples.

Before: the replay guard (series -> last round's event time) kept every series it ever saw, one per access key
(``s3_frontend_credential{access_key}``), and a series' key held its tags whole: rotating credentials, a scanner
trying keys, or one tag of 600 kB grew the host's state past Kafka's 1 MB record, and the write crashed the
worker (``test_keystone_state_bounds_live.py``). Validation and small-request counts of up to 1e12 a round
summed past 2**53 in a pane or a window, which the restore refuses: the host started afresh at every restart.
Now the guard forgets what a replay cannot double-count (and, past its cap, the oldest, counted), a long key is
hashed, and a round that would pass 2**53 is refused at ingest (counted, dead-lettered)."""

from __future__ import annotations

import orjson
from prometheus_client import REGISTRY

from opsloop.records import Metric, metric
from opsloop.streams.detectors.keystone.handler import KeystoneHandler

T0 = 1_795_400_000.0
T5 = T0 - T0 % 300   # a window start (p95: 300 s), so a pane start too (60 s)
HOST = "rgw-1"
RECORD_LIMIT = 1_000_000   # the producer's max_request_size (Faust's default): a larger state crashed the worker
GUARD_CAP = 2048
STATE_MAX = 2 ** 53        # the largest count a restore takes (state_check.MAX_COUNT)


def _cred(key: str, ts: float, validations: float = 3, host: str = HOST) -> Metric:
    return metric("s3_frontend_credential", {"keystone_validations": validations, "requests": validations},
                  {"host": host, "access_key": key}, ts)


def _stored(h: KeystoneHandler, host: str = HOST) -> tuple[dict, int]:
    """``host``'s state as the changelog carries it, and its size in bytes."""
    state = h.state_of(host)
    assert state is not None
    raw = orjson.dumps(state)
    return orjson.loads(raw), len(raw)


def _restored(state: dict, host: str = HOST) -> KeystoneHandler:
    fresh = KeystoneHandler()
    fresh.restore_key(host, state)   # raises StateError on a state the restore refuses
    return fresh


def _dropped() -> float:
    return REGISTRY.get_sample_value("opsloop_keystone_replay_guard_dropped_total") or 0.0


def test_rotating_access_keys_leave_the_guard_with_the_window_only() -> None:
    """A day of 60 s rounds, 20 new access keys each (the collector's top 20 of a scanner): the guard holds the
    series of the 5-minute window, not the 28,800 seen, and still refuses a replay of the last round."""
    h = KeystoneHandler()
    for r in range(1440):
        ts = T0 + 60 * r
        h.handle([_cred(f"AKIA{r:05d}{i:02d}" + "X" * 100, ts) for i in range(20)], ts)
    state, size = _stored(h)
    assert len(state["last_ts"]) <= 6 * 20, len(state["last_ts"])   # 5 panes of the window (+ the newest)
    assert size < 100_000, size
    total = h.hosts[HOST].heavy.window.shares()[0]
    last = T0 + 60 * 1439
    h.handle([_cred(f"AKIA{1439:05d}{i:02d}" + "X" * 100, last) for i in range(20)], last + 5)   # replayed
    assert h.hosts[HOST].heavy.window.shares()[0] == total
    fresh = _restored(state)
    fresh.handle([_cred(f"AKIA{1439:05d}{i:02d}" + "X" * 100, last) for i in range(20)], last + 5)   # after a crash
    assert fresh.hosts[HOST].heavy.window.shares()[0] == total


def test_a_series_the_window_no_longer_counts_is_forgotten_and_its_replay_counts_nothing() -> None:
    h = KeystoneHandler()
    h.handle([_cred("AKIAOLD", T0, 50)], T0)
    for r in range(1, 8):   # another key's rounds move the 300 s window past AKIAOLD's pane
        h.handle([_cred("AKIANEW", T0 + 60 * r, 5)], T0 + 60 * r)
    assert not any("AKIAOLD" in s for s in h.hosts[HOST].last_ts)
    before = h.hosts[HOST].heavy.window.shares()
    h.handle([_cred("AKIAOLD", T0, 50)], T0 + 500)   # a replay of its old round: too old for the window
    assert h.hosts[HOST].heavy.window.shares() == before
    assert h.rejected == 0


def test_probe_and_request_series_are_guarded_for_an_hour_of_the_hosts_rounds() -> None:
    h = KeystoneHandler()
    probe = metric("keystone_probe", {"count": 5, "p50_ms": 12.0}, {"host": HOST, "probe": "token"}, T0)
    h.handle([probe], T0)
    h.handle([_cred("AKIA1", T0 + 3000)], T0 + 3000)
    assert "keystone_probe|probe=token" in h.hosts[HOST].last_ts   # 50 min: still guarded
    n = h.hosts[HOST].regimes["probe:token"].n
    h.handle([probe], T0 + 3000)   # replayed
    assert h.hosts[HOST].regimes["probe:token"].n == n
    h.handle([_cred("AKIA1", T0 + 3700)], T0 + 3700)
    assert "keystone_probe|probe=token" not in h.hosts[HOST].last_ts


def test_a_flood_of_series_inside_the_window_is_capped_and_counted() -> None:
    """5,000 access keys in one round (a scanner, a collector with top_credentials raised): the guard keeps
    2,048 of them, the rest counted; every validation is counted, the state fits a Kafka record."""
    h = KeystoneHandler()
    before = _dropped()
    h.handle([_cred(f"AKIA{i:05d}" + "K" * 240, T0) for i in range(5000)], T0)
    state, size = _stored(h)
    assert len(state["last_ts"]) == GUARD_CAP
    assert _dropped() - before == 5000 - GUARD_CAP
    assert size < RECORD_LIMIT // 2, size
    assert h.hosts[HOST].heavy.window.shares()[0] == 5000 * 3
    _restored(state)


def test_a_huge_tag_makes_no_huge_guard_key_and_its_replay_is_still_refused() -> None:
    h = KeystoneHandler()
    rounds = [metric("keystone_probe", {"count": 5, "p50_ms": 12.0},
                     {"host": HOST, "probe": "token", "note": c * 600_000}, T0) for c in "ab"]
    h.handle(rounds, T0)
    state, size = _stored(h)
    assert size < 10_000, size
    assert all(len(s) <= 160 for s in state["last_ts"])
    n = h.hosts[HOST].regimes["probe:token"].n
    h.handle(rounds, T0 + 5)   # replayed
    assert h.hosts[HOST].regimes["probe:token"].n == n
    fresh = _restored(state)
    fresh.handle(rounds, T0 + 5)
    assert fresh.hosts[HOST].regimes["probe:token"].n == n


def test_validation_counts_a_restore_would_refuse_are_refused_at_ingest() -> None:
    """9,100 rounds of 1e12 validations in one pane: the pane's count stops short of 2**53, the rest are refused
    (counted, dead-lettered, the error naming the bound); the state restores, the host's good rounds go on."""
    h = KeystoneHandler()
    h.handle([_cred("AKIAHOT", T5 + i * 0.005, 1e12) for i in range(9100)], T5 + 50)
    assert h.rejected == 9100 - STATE_MAX // 10 ** 12
    refused = h.drain_rejected()
    assert refused and str(STATE_MAX) in refused[0].error and "validation count" in refused[0].error
    state, _ = _stored(h)
    fresh = _restored(state)   # StateError (heavy.window.panes[0][1].total) on the old code
    assert fresh.hosts[HOST].heavy.window.shares()[0] == (STATE_MAX // 10 ** 12) * 10 ** 12
    fresh.handle([_cred("AKIAGOOD", T5 + 61, 7)], T5 + 61)   # the next pane counts afresh
    assert fresh.rejected == 0
    assert ("AKIAGOOD", 7) in [(k, c) for k, _, c in fresh.hosts[HOST].heavy.window.shares()[1]]


def test_small_request_counts_a_restore_would_refuse_are_refused_at_ingest() -> None:
    h = KeystoneHandler()
    rounds = [metric("s3_frontend_requests", {"small_requests": 1e12, "small_p50_ms": 10.0, "small_p95_ms": 40.0},
                     {"host": HOST}, T5 + i * 0.01) for i in range(9100)]
    h.handle(rounds, T5 + 100)
    assert h.rejected == 9100 - STATE_MAX // 10 ** 12
    state, _ = _stored(h)
    fresh = _restored(state)   # StateError (p95.hist.count) on the old code
    assert fresh.hosts[HOST].p95.hist.count == (STATE_MAX // 10 ** 12) * 10 ** 12
    good = metric("s3_frontend_requests", {"small_requests": 50, "small_p50_ms": 10.0, "small_p95_ms": 40.0},
                  {"host": HOST}, T5 + 301)   # the next window
    fresh.handle([good], T5 + 301)
    assert fresh.rejected == 0 and fresh.hosts[HOST].p95.hist.count == 50


def test_a_stored_guard_beyond_the_cap_is_cut_at_the_restore() -> None:
    """A state written before the bound: restored (not refused), its guard cut to the newest 2,048."""
    h = KeystoneHandler()
    h.handle([_cred("AKIA1", T5)], T5)
    state, _ = _stored(h)   # 3,000 series of the window's pane
    state["last_ts"] = {f"s3_frontend_credential|access_key=K{i}": T5 + i * 0.01 for i in range(3000)}
    fresh = _restored(state)
    guard = fresh.hosts[HOST].last_ts
    assert len(guard) == GUARD_CAP and "s3_frontend_credential|access_key=K2999" in guard
