"""The topology API: bearer auth, OpenAPI spec, validated and audited changes, status and weights."""

from __future__ import annotations

import secrets
from typing import Iterator

import pytest
import requests
from hypothesis import given, settings, strategies as st

from opsloop.controllers.edge.service.api import EdgeApi, openapi_spec
from opsloop.controllers.edge.service.config import TopologySpec
from opsloop.controllers.edge.service.store import TopologyStore
from opsloop.audit.trail import AuditLog

TOKEN = secrets.token_hex(20)


class Recorder:
    def __init__(self) -> None:
        self.records = []

    def submit(self, record) -> None:
        self.records.append(record)


@pytest.fixture
def served() -> Iterator[tuple[EdgeApi, str, Recorder]]:
    topo = TopologySpec.model_validate({"listeners": [{
        "name": "web", "edges": [{"name": "ams"}],
        "origins": [{"name": "near", "capacity_rps": 40}, {"name": "far", "capacity_rps": 1000}],
        "latency_ms": {"ams": {"near": 2, "far": 30}}}]})
    rec = Recorder()
    store = TopologyStore(topo, AuditLog([rec]))
    api = EdgeApi(store, TOKEN, lambda: {"web": {"mode": "normal", "version": 3}},
                  lambda listener: [{"edge": "ams", "weights": {"near": 0.4, "far": 0.6}}])
    api.serve("127.0.0.1", 0)
    try:
        yield api, f"http://127.0.0.1:{api.port}", rec
    finally:
        api.stop()


def call(method: str, url: str, token: str | None = TOKEN, **kw) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.request(method, url, headers=headers, timeout=5, **kw)


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN[:-1], TOKEN + "x"],
                         ids=["none", "empty", "wrong", "truncated", "extended"])  # not the secret in test ids
def test_every_v1_route_needs_the_token(served, token) -> None:
    _, base, rec = served
    for method, path in [("GET", "/v1/status"), ("GET", "/v1/topology"),
                         ("PUT", "/v1/listeners/web/origins/near/capacity")]:
        r = call(method, base + path, token, json={"capacity_rps": 1})
        assert r.status_code == 401 and "WWW-Authenticate" in r.headers
    assert rec.records == []


def test_spec_is_public_and_lists_the_routes(served) -> None:
    _, base, _ = served
    spec = requests.get(base + "/openapi.json", timeout=5).json()
    assert spec == openapi_spec()
    assert spec["openapi"].startswith("3.") and "bearer" in spec["components"]["securitySchemes"]
    assert "put" in spec["paths"]["/v1/listeners/{listener}/origins/{origin}/capacity"]


def test_capacity_and_health_changes_are_applied_and_audited(served) -> None:
    api, base, rec = served
    r = call("PUT", base + "/v1/listeners/web/origins/near/capacity", json={"capacity_rps": 55, "reason": "upgrade"})
    assert r.status_code == 200 and r.json()["capacity_rps"] == 55
    assert call("GET", base + "/v1/listeners/web/origins/near/capacity").json()["capacity_rps"] == 55
    assert api.store.snapshot("web").spec.origins[0].capacity_rps == 55
    r = call("PUT", base + "/v1/listeners/web/origins/far/health", json={"healthy": False})
    assert r.json()["health_override"] is False
    assert call("GET", base + "/v1/listeners/web/origins/far").json()["health_override"] is False
    r = call("PUT", base + "/v1/listeners/web/edges/ams/latency/far", json={"latency_ms": 12.5})
    assert r.json()["latency_ms"] == 12.5 and api.store.snapshot("web").spec.latency_ms["ams"]["far"] == 12.5
    actions = [(a.action, a.before, a.after) for a in rec.records]
    assert actions == [("edge.topology.capacity", {"capacity_rps": 40.0}, {"capacity_rps": 55.0}),
                       ("edge.topology.health", {"health_override": None}, {"health_override": False}),
                       ("edge.topology.latency", {"latency_ms": 30.0}, {"latency_ms": 12.5})]
    assert rec.records[0].reason == "upgrade" and rec.records[0].listener == "web"
    assert all(TOKEN not in a.model_dump_json() for a in rec.records)


def test_status_and_weights(served) -> None:
    _, base, _ = served
    assert call("GET", base + "/v1/status").json() == {"web": {"mode": "normal", "version": 3}}
    assert call("GET", base + "/v1/listeners/web/weights").json()["records"][0]["weights"]["far"] == 0.6
    assert call("GET", base + "/v1/listeners/nope/weights").status_code == 404


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/listeners/web/origins/near/capacity", {"capacity_rps": -1}, 400, "capacity_rps"),
    ("/v1/listeners/web/origins/near/capacity", {"capacity_rps": "lots"}, 400, "'lots'"),
    ("/v1/listeners/web/origins/near/capacity", {"capacity": 5}, 400, "capacity_rps"),
    ("/v1/listeners/web/origins/near/health", {"healthy": "yes"}, 400, "'yes'"),
    ("/v1/listeners/web/origins/mars/capacity", {"capacity_rps": 5}, 404, "'mars'"),
    ("/v1/listeners/app/origins/near/capacity", {"capacity_rps": 5}, 404, "'app'"),
    ("/v1/listeners/web/edges/fra/latency/near", {"latency_ms": 5}, 404, "'fra'"),
    ("/v1/listeners/web/origins/near/weights", {}, 404, "no such path"),
])
def test_bad_changes_are_refused_naming_what_was_wrong(served, path, body, status, needle) -> None:
    _, base, rec = served
    r = call("PUT", base + path, json=body)
    assert r.status_code == status and needle in r.json()["error"]
    assert rec.records == []


def test_non_json_body_and_wrong_method(served) -> None:
    _, base, _ = served
    r = call("PUT", base + "/v1/listeners/web/origins/near/capacity", data=b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    assert call("DELETE", base + "/v1/listeners/web/origins/near/capacity").status_code == 405


@settings(max_examples=150, deadline=None)
@given(method=st.sampled_from(["GET", "PUT", "POST"]), path=st.text(max_size=60),
       body=st.binary(max_size=100), auth=st.one_of(st.none(), st.just(f"Bearer {TOKEN}"), st.text(max_size=30)))
def test_dispatch_fuzz_never_crashes(method, path, body, auth) -> None:
    topo = TopologySpec.model_validate({"listeners": [{"name": "web", "edges": [{"name": "e"}],
                                                       "origins": [{"name": "o", "capacity_rps": 1}]}]})
    api = EdgeApi(TopologyStore(topo, AuditLog()), TOKEN, dict, lambda listener: [])
    status, doc = api.dispatch(method, "/v1/" + path, auth, body)
    assert status in (200, 400, 401, 404, 405) and isinstance(doc, (dict, list))
    if auth != f"Bearer {TOKEN}":
        assert status in (401, 404)


def test_names_are_percent_decoded_from_the_path() -> None:
    """A listener or origin whose name holds a ``/``, a space or non-ASCII letters is addressed percent-encoded
    (as curl and requests send it); before, the encoded segment was matched as it was and such an origin could
    not be drained through the API (404 "no origin 'dc%202'")."""
    topo = TopologySpec.model_validate({"listeners": [{
        "name": "192.0.2.1:443/tcp", "edges": [{"name": "ams"}],
        "origins": [{"name": "dc 2", "capacity_rps": 40}, {"name": "zürich", "capacity_rps": 1000}],
        "latency_ms": {"ams": {"dc 2": 2, "zürich": 30}}}]})
    store = TopologyStore(topo, AuditLog())
    api = EdgeApi(store, TOKEN, lambda: {}, lambda listener: [])
    auth = f"Bearer {TOKEN}"
    status, doc = api.dispatch("PUT", "/v1/listeners/192.0.2.1%3A443%2Ftcp/origins/dc%202/health", auth,
                               b'{"healthy": false}')
    assert status == 200 and doc["origin"] == "dc 2" and doc["health_override"] is False, doc
    status, doc = api.dispatch("PUT", "/v1/listeners/192.0.2.1:443%2Ftcp/edges/ams/latency/z%C3%BCrich", auth,
                               b'{"latency_ms": 12}')
    assert status == 200 and store.snapshot("192.0.2.1:443/tcp").spec.latency_ms["ams"]["zürich"] == 12
    status, doc = api.dispatch("GET", "/v1/listeners/192.0.2.1%3A443%2Ftcp/origins/z%FCrich", auth, b"")
    assert status == 400 and "UTF-8" in doc["error"]
