"""The edge control service on bad input: absurd capacities and latencies (API and overrides file,
one validator), an API pin that would send traffic to a server the LB reports DOWN, controller
epochs across restarts, and the API server itself (token before body, socket timeout, connection
cap, no credentials in logs, a private token file)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests
from prometheus_client import REGISTRY

from opsloop.controllers.edge.service.api import EdgeApi
from opsloop.records import EdgeDemand, EdgeWeights
from opsloop.controllers.edge.service.api_token import create_token_file
from opsloop.controllers.edge.service.inputs import DemandBook
from opsloop.controllers.edge.service.config import ApiSettings, ConfigError, TopologySpec, read_token
from opsloop.controllers.edge.service.overrides import OverridesError
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.controllers.edge.service.kafka_io import recover_decisions
from opsloop.audit.trail import AuditLog
from tests.controllers.edge.service.test_loop import T0, Harness
from tests.controllers.edge.service.test_recover_backwards import send_all
from tests.helpers import captured_logs, create_topics, unique, wait_until

TOKEN = secrets.token_hex(20)


def topology() -> TopologySpec:
    return TopologySpec.model_validate({"listeners": [{
        "name": "web", "edges": [{"name": "ams"}],
        "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 1000}],
        "latency_ms": {"ams": {"near": 2, "far": 30}}}]})


@pytest.fixture
def api() -> Iterator[EdgeApi]:
    a = EdgeApi(TopologyStore(topology(), AuditLog()), TOKEN, lambda: {}, lambda listener: [])
    yield a
    a.stop()


def call(method: str, url: str, **kw) -> requests.Response:
    return requests.request(method, url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, **kw)


# -- one validator for the API and the overrides file --------------------------------------------------
BAD_CAPACITY = [float("nan"), -1.0, float("inf"), 1e20]
BAD_LATENCY = [float("nan"), -5.0, 1e20]


@pytest.mark.parametrize("value", BAD_CAPACITY)
def test_overrides_file_capacity_is_validated_on_restore_naming_the_field(tmp_path: Path, value: float) -> None:
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps({"version": 1, "capacity_rps": {"web": {"near": value}}}))  # NaN/Infinity as JSON does
    with pytest.raises(OverridesError, match=r"capacity_rps\['web'\]\['near'\]") as e:
        TopologyStore(topology(), AuditLog(), path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("value", BAD_LATENCY)
def test_overrides_file_latency_is_validated_on_restore_naming_the_field(tmp_path: Path, value: float) -> None:
    path = tmp_path / "overrides.json"
    path.write_text(json.dumps({"version": 1, "latency_ms": {"web": {"ams": {"far": value}}}}))
    with pytest.raises(OverridesError, match=r"latency_ms\['web'\]\['ams'\]\['far'\]"):
        TopologyStore(topology(), AuditLog(), path)


@pytest.mark.parametrize("route,field,value", [("origins/near/capacity", "capacity_rps", 1e20),
                                               ("origins/near/capacity", "capacity_rps", -3),
                                               ("edges/ams/latency/far", "latency_ms", 1e20),
                                               ("edges/ams/latency/far", "latency_ms", -1)])
def test_api_refuses_values_the_scheduler_cannot_use(api: EdgeApi, route: str, field: str, value: float) -> None:
    api.serve("127.0.0.1", 0)
    r = call("PUT", f"http://127.0.0.1:{api.port}/v1/listeners/web/{route}", json={field: value})
    assert r.status_code == 400 and field in r.json()["error"] and repr(value) in r.json()["error"]
    assert api.store.origin("web", "near")["capacity_rps"] == 40
    assert api.store.snapshot("web").spec.latency_ms["ams"]["far"] == 30


def test_a_valid_override_survives_and_a_no_path_latency_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "overrides.json"
    first = TopologyStore(topology(), AuditLog(), path)
    first.set_latency("web", "ams", "far", float("inf"))
    first.set_capacity("web", "near", 55)
    again = TopologyStore(topology(), AuditLog(), path)
    assert "far" not in again.snapshot("web").spec.latency_ms["ams"] and again.origin("web", "near")["capacity_rps"] == 55


# -- a health pin does not override DOWN without force ------------------------------------------------
def test_a_pin_up_does_not_override_the_load_balancers_down_unless_forced(tmp_path: Path) -> None:
    h = Harness("pin")
    for _ in range(3):
        h.demand("e1", 20.0)
        h.step()
    h.store.set_health("pin", "near", True, reason="the check is noisy")
    h.demand("e1", 20.0, near_up=False)            # the LB reports near DOWN
    d = h.step()
    status = h.loop.status()["pin"]
    assert d.weights[0, 0] == 0.0 and status["healthy"]["near"] is False
    assert status["pinned_up_but_down"] == ["near"]
    h.store.set_health("pin", "near", True, reason="the check is wrong, CHG-1", force=True)
    h.demand("e1", 20.0, near_up=False)
    h.step()
    assert h.loop.status()["pin"]["healthy"]["near"] is True and h.loop.status()["pin"]["pinned_up_but_down"] == []
    assert h.store.origin("pin", "near")["health_forced"] is True
    h.store.set_health("pin", "near", None)        # clearing the pin clears the force
    assert h.store.origin("pin", "near")["health_forced"] is False


def test_force_is_only_for_a_pin_up_and_survives_a_restart(tmp_path: Path, api: EdgeApi) -> None:
    api.serve("127.0.0.1", 0)
    base = f"http://127.0.0.1:{api.port}/v1/listeners/web/origins/far/health"
    r = call("PUT", base, json={"healthy": False, "force": True})
    assert r.status_code == 400 and "force" in r.json()["error"]
    r = call("PUT", base, json={"healthy": True, "force": "yes"})
    assert r.status_code == 400 and "force" in r.json()["error"]
    path = tmp_path / "overrides.json"
    first = TopologyStore(topology(), AuditLog(), path)
    first.set_health("web", "far", True, force=True)
    assert TopologyStore(topology(), AuditLog(), path).origin("web", "far")["health_forced"] is True


# -- epochs ------------------------------------------------------------------------------------------
def test_records_carry_an_epoch_above_every_sane_recovered_one() -> None:
    """Sane: within the recovery's bound of this host's clock (kafka_io.MAX_EPOCH_AHEAD_S); a predecessor whose
    clock ran a few seconds ahead is outranked. A recovered epoch beyond the bound never gets here (see below)."""
    future = int(T0 * 1000) + 4_000     # a predecessor whose clock ran 4 s ahead
    rec = EdgeWeights(version=41, epoch=future, listener="epoch", edge="e1", weights={"near": 0.3, "far": 0.7},
                      computed_at=T0)
    h = Harness("epoch", recovered={("epoch", "e1"): rec})
    assert h.loop.epoch == future + 1
    h.demand("e1", 20.0)
    h.step()
    records = h.published[-1][0]
    assert records and all(r.epoch == future + 1 and r.stamp > rec.stamp for r in records)
    assert Harness("epoch2").loop.epoch == int(T0 * 1000)   # nothing recovered: the start time in ms


def _recover(kafka_bootstrap: str, listener: str, records: list[EdgeWeights], **kw) -> dict:
    topic = unique("weights-epochs")
    create_topics(kafka_bootstrap, topic)
    send_all(kafka_bootstrap, topic, [(0, f"{r.listener}|{r.edge}", r.encode()) for r in records])
    return recover_decisions(kafka_bootstrap, topic=topic, timeout_s=60.0, expected=[(listener, "e1")], **kw)


@pytest.mark.integration
def test_a_recovered_epoch_far_in_the_future_is_not_chased(kafka_bootstrap: str) -> None:
    """A record whose epoch is a year ahead (a controller started with its clock a year ahead, a hand-made
    record) was recovered as the newest and this instance took its epoch + 1: a year ahead too, so the actuators
    (which refuse an epoch beyond their max_clock_skew_s) refused every decision it made. Now it is skipped (said
    once, kind epoch_ahead): the newest sane record is continued from and the epoch is this host's start time."""
    listener = unique("epoch")
    now_ms = int(time.time() * 1000)   # recovery's clock is this host's (the Harness's runs at T0, earlier)
    sane = EdgeWeights(version=41, epoch=now_ms - 60_000, listener=listener, edge="e1",
                       weights={"near": 0.3, "far": 0.7}, computed_at=T0 - 5)
    year = EdgeWeights(version=3, epoch=now_ms + 365 * 86_400_000, listener=listener, edge="e1",
                       weights={"near": 0.9, "far": 0.1}, computed_at=T0 - 1)
    with captured_logs() as logs:
        recovered = _recover(kafka_bootstrap, listener, [sane, year])
    assert recovered == {(listener, "e1"): sane}, recovered
    assert any("recover_record_rejected" in line and "epoch_ahead" in line for line in logs.lines), logs.lines
    h = Harness(listener, recovered=recovered)
    assert h.loop.epoch == sane.epoch + 1
    h.demand("e1", 20.0)
    h.step()
    records = h.published[-1][0]
    assert records and all(r.epoch == sane.epoch + 1 and r.version > sane.version for r in records), records


@pytest.mark.integration
def test_a_recovered_epoch_a_few_seconds_ahead_is_still_outranked(kafka_bootstrap: str) -> None:
    """Within the bound (a predecessor's clock legitimately a few seconds ahead, its decisions taken by the
    actuators): recovered and outranked, so this instance is not fenced below it."""
    listener = unique("epoch")
    ahead = EdgeWeights(version=7, epoch=int(T0 * 1000) + 4_000, listener=listener, edge="e1",
                        weights={"near": 0.3, "far": 0.7}, computed_at=T0 + 4)
    recovered = _recover(kafka_bootstrap, listener, [ahead], clock=lambda: T0)
    assert recovered == {(listener, "e1"): ahead}
    assert Harness(listener, recovered=recovered).loop.epoch == ahead.epoch + 1


# -- the API server -------------------------------------------------------------------------------------
def _raw(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(data)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def test_the_token_is_checked_before_the_body_is_read(api: EdgeApi) -> None:
    api.serve("127.0.0.1", 0)
    # a large body announced but never sent: answered 401 at once, not read (and the connection closed)
    s = _raw(api.port, b"PUT /v1/listeners/web/origins/near/capacity HTTP/1.1\r\nHost: x\r\n"
                       b"Authorization: Bearer wrong\r\nContent-Length: 60000\r\n\r\n")
    with s:
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 401") and b"Connection: close" in reply


def test_a_silent_client_is_cut_off_by_the_socket_timeout(api: EdgeApi) -> None:
    api.serve("127.0.0.1", 0, timeout_s=0.5)
    with _raw(api.port, b"GET /v1/topology HTTP/1.1\r\n") as s:   # headers never finished
        assert _read_all(s) == b""                                  # the server closed it
    with _raw(api.port, b"PUT /v1/listeners/web/origins/near/capacity HTTP/1.1\r\nHost: x\r\n"
                        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode() + b"{") as s:
        assert _read_all(s) == b""                                  # body never finished
    assert call("GET", f"http://127.0.0.1:{api.port}/v1/topology").status_code == 200


def test_connections_beyond_the_cap_get_503_and_a_slot_frees_when_one_closes(api: EdgeApi) -> None:
    api.serve("127.0.0.1", 0, timeout_s=60, max_connections=2)
    idle = [_raw(api.port, b"") for _ in range(2)]
    try:
        with _raw(api.port, b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n") as s:
            assert _read_all(s).startswith(b"HTTP/1.1 503")
    finally:
        idle[0].close()
    try:
        wait_until(lambda: _status(api.port) == 200, timeout=60, what="a slot free after one connection closed")
    finally:
        idle[1].close()


def _status(port: int) -> int:
    try:
        return requests.get(f"http://127.0.0.1:{port}/openapi.json", timeout=10).status_code
    except requests.RequestException:
        return 0


def test_credentials_and_query_strings_never_reach_the_log(api: EdgeApi, caplog) -> None:
    api.serve("127.0.0.1", 0)
    caplog.set_level(logging.DEBUG)
    secret = "hunter2-" + secrets.token_hex(4)
    for target in (f"http://admin:{secret}@127.0.0.1:{api.port}/v1/topology?x=1",
                   f"/v1/topology?access_token={secret}"):
        with _raw(api.port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode()
                  + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()) as s:
            assert _read_all(s).startswith(b"HTTP/1.1 200")
    logged = [r for r in caplog.records if r.name.endswith("controller.edge.api")]
    assert any(getattr(r, "fields", {}).get("path") == "/v1/topology" for r in logged)
    assert not any(secret in f"{r.getMessage()} {getattr(r, 'fields', '')}" for r in caplog.records)


# -- the token file ---------------------------------------------------------------------------------------
def test_token_file_is_private_from_creation_and_an_open_one_is_refused(tmp_path: Path) -> None:
    old = os.umask(0)                                  # the most permissive umask: the mode must not depend on it
    try:
        token = create_token_file(tmp_path / "edge.token")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "edge.token").stat().st_mode) == 0o600
    assert read_token(ApiSettings(token_file=tmp_path / "edge.token")) == token
    with pytest.raises(FileExistsError):
        create_token_file(tmp_path / "edge.token")      # never overwritten
    leaked = tmp_path / "leaked.token"
    leaked.write_text(secrets.token_hex(20))
    leaked.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as e:
        read_token(ApiSettings(token_file=leaked))
    assert str(leaked) in str(e.value) and leaked.read_text() not in str(e.value)


# -- the demand book ---------------------------------------------------------------------------------------
def test_a_demand_record_from_the_future_cannot_pin_the_book() -> None:
    clock = [T0]
    book = DemandBook(max_clock_skew_s=5.0, ttl_s=600.0, clock=lambda: clock[0])

    def rec(edge: str, ts: float, rps: float = 10.0) -> EdgeDemand:
        return EdgeDemand(edge=edge, backend="be", demand_rps=rps, timestamp=ts)

    before = REGISTRY.get_sample_value("opsloop_edge_demand_rejected_total", {"reason": "future"}) or 0.0
    assert book.update(rec("ams", T0 + 86_400 * 365, rps=1.0)) is False      # a year ahead: refused
    assert book.update(rec("ams", T0 + 3, rps=2.0)) is True                   # within the skew
    assert book.update(rec("ams", T0 + 1, rps=3.0)) is True and book.get("be", "ams").demand_rps == 2.0
    clock[0] += 10
    assert book.update(rec("ams", T0 + 10, rps=4.0)) and book.get("be", "ams").demand_rps == 4.0   # not pinned
    assert REGISTRY.get_sample_value("opsloop_edge_demand_rejected_total", {"reason": "future"}) == before + 1
    # keys silent for ttl_s go away (an LB that was decommissioned)
    book.update(rec("gone", T0 + 10))
    clock[0] += 700
    book.update(rec("ams", clock[0]))
    assert book.get("be", "gone") is None and len(book) == 1
