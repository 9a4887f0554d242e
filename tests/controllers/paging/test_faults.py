"""Failure modes of the paging actuator's delivery, reproduced without waiting for them.

Alertmanager away for hours: the back-off counts every failed attempt; 2 ** failures overflowed a
float at the 1024th (about 6 hours at the 30 s cap), and every step then raised before the state was
saved and the offsets committed, with no delivery failure counted.

A state file that is JSON of the right version but holds wrong types (an entry edited by hand, a
disk error that left valid JSON) loaded, and every delivery after it raised: paging was wedged
until someone deleted the file.

A finding flood (10^4 distinct ids): every due alert went in one POST, 10.8 MB, which a real
Alertmanager took 20 s to take in (6.5 s the second time) against a 5 s request timeout: the post
failed, backed off and was sent whole again, and no page of the flood ever counted as delivered.
"""

from __future__ import annotations

import random
import time
from http.server import BaseHTTPRequestHandler
from typing import Iterator

import orjson
import pytest

from opsloop.controllers.paging import metrics
from opsloop.controllers.paging.alertmanager import AlertmanagerClient, Backoff
from opsloop.controllers.paging.config import PagingConfig
from opsloop.controllers.paging.service import PagingService
from tests.controllers.paging.test_unit import T0, FlakyClient, finding
from tests.helpers import serve_http

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


# -- a state file that is JSON of the right version but not what we wrote ----------------------------
GOOD = {"finding_id": "a", "labels": {"alertname": "A", "severity": "critical"}, "annotations": {"summary": "s"},
        "starts_at": T0, "event_time": T0}


@pytest.mark.parametrize("damage", [
    {"open": [{**GOOD, "labels": "alertname=A"}]},
    {"open": [{**GOOD, "starts_at": "yesterday"}]},
    {"open": [{**GOOD, "annotations": {"summary": 3}}]},
    {"open": [GOOD, {**GOOD, "finding_id": "b", "event_time": None}]},   # the first entry fine: all or nothing
    {"open": [{**GOOD, "delivered_once": "yes"}]},
    {"resolves": [{**GOOD, "ends_at": [T0]}]},
    {"open": "a"},
])
def test_a_state_file_with_wrong_types_starts_empty_instead_of_failing_every_delivery(tmp_path, damage) -> None:
    state = tmp_path / "state.json"
    doc = {"version": 1, "open": [], "resolves": [], **damage}
    if "resolves" in damage:
        doc["resolves"] = [{k: v for k, v in r.items() if k != "event_time"} for r in damage["resolves"]]
    state.write_bytes(orjson.dumps(doc))
    cfg = PagingConfig(state_file=state, start_offset="latest")
    client = FlakyClient(failures=0)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]
    svc.load_state()
    assert svc.book.open == {} and svc.book.resolves == {}   # refused whole, said in the log
    svc.handle_records([finding().encode()], T0)
    assert svc.deliver(T0) == 1
    svc.save_state()
    assert [a["finding_id"] for a in orjson.loads(state.read_bytes())["open"]] == [finding().id]


# -- a finding flood against an Alertmanager whose cost grows with the body ------------------------------
FLOOD = 10_000
SECONDS_PER_ALERT = 0.0005     # 10^4 alerts in one body: 5 s, past the client's 2 s timeout below


class SlowAlertmanager(BaseHTTPRequestHandler):
    received: list[int] = []

    def do_POST(self) -> None:  # noqa: N802
        body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(SECONDS_PER_ALERT * len(body))   # the work Alertmanager does per alert
        self.received.append(len(body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_alertmanager() -> Iterator[str]:
    SlowAlertmanager.received = []
    with serve_http(SlowAlertmanager) as url:
        yield url


def test_a_flood_of_distinct_findings_is_delivered_in_bodies_alertmanager_takes_in_time(
        tmp_path, slow_alertmanager: str) -> None:
    cfg = PagingConfig(state_file=tmp_path / "state.json", start_offset="latest", request_timeout_s=2.0)
    client = AlertmanagerClient([slow_alertmanager], timeout_s=cfg.request_timeout_s)
    svc = PagingService(cfg, "127.0.0.1:1", consumer=object(), producer=None, client=client)  # type: ignore[arg-type]
    try:
        svc.handle_records([finding(hypervisor=f"hv-{i}", vm="web", port="p").encode() for i in range(FLOOD)], T0)
        assert svc.deliver(T0) == FLOOD
        assert sum(SlowAlertmanager.received) == FLOOD
        assert all(a.delivered_once for a in svc.book.open.values())
        assert svc.book.due(T0 + 1) == []      # nothing re-sent before the re-send interval
    finally:
        client.close()
