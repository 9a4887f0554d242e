"""Failure modes of the paging actuator's delivery, reproduced without waiting for them.

Alertmanager away for hours: the back-off counts every failed attempt; 2 ** failures overflowed a
float at the 1024th (about 6 hours at the 30 s cap), and every step then raised before the state was
saved and the offsets committed, with no delivery failure counted.
"""

from __future__ import annotations

import random

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import Backoff
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.controllers.paging.test_unit import T0, FlakyClient, finding

ATTEMPTS = 1100   # past 2 ** 1024, the first power of two a float cannot hold


def test_backoff_stays_at_its_cap_however_long_the_outage() -> None:
    b = Backoff(initial_s=0.5, max_s=30.0, rng=random.Random(3))
    delays = [b.failed(T0) for _ in range(ATTEMPTS)]
    assert all(15.0 <= d <= 30.0 for d in delays[-100:]), delays[-3:]
    b.succeeded()
    assert b.ready(T0) and b.failed(T0) <= 0.5


def test_backoff_after_a_backward_clock_step_waits_at_most_its_cap() -> None:
    b = Backoff(initial_s=1.0, max_s=8.0, rng=random.Random(3))
    b.failed(T0)                       # not before T0 + ~1 s on the old clock
    stepped_back = T0 - 3600           # NTP steps the wall clock back an hour
    assert b.ready(stepped_back), "a retry would wait for the hour the clock went back"
    assert b.wait(stepped_back) == 0.0


def test_paging_survives_an_alertmanager_outage_of_a_thousand_attempts(tmp_path) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", backoff_initial_s=0.5, backoff_max_s=30,
                       start_offset="latest")
    client = FlakyClient(failures=ATTEMPTS)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]
    svc.handle_records([finding().encode()], T0)
    failures_before = metrics.DELIVERY_FAILURES._value.get()
    now = T0
    for _ in range(ATTEMPTS):
        assert svc.deliver(now) == 0
        now += svc.backoff.wait(now) + 0.01
    assert client.failures == 0
    assert metrics.DELIVERY_FAILURES._value.get() - failures_before == ATTEMPTS
    assert svc.deliver(now) == 1       # Alertmanager back: the page goes out at the next attempt
    assert client.bodies[0][0]["labels"]["alertname"] == "FirewallUnprotectedPort"
