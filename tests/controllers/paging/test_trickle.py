"""An Alertmanager (or the proxy in front of it) that answers a byte now and then without end. Each read
was bounded by request_timeout_s, the reply was not: the post never returned, so the paging loop stopped
(no poll, no delivery), and with an HA pair the healthy second member was never tried."""

from __future__ import annotations

import time

import pytest
import requests

from opsloop.controllers.paging.alertmanager import AlertmanagerClient, AlertmanagerError
from tests.alerting import am_url
from tests.trickle import ends_within, trickle_server


def alert(name: str) -> dict[str, object]:
    return {"labels": {"alertname": name, "severity": "warning", "signal": "pipeline"},
            "annotations": {"summary": "trickle test"},
            "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 300))}


def test_a_trickling_alertmanager_fails_the_post_naming_it() -> None:
    with trickle_server() as port:
        client = AlertmanagerClient([f"http://127.0.0.1:{port}"], timeout_s=0.5)
        with pytest.raises(AlertmanagerError, match=f"127.0.0.1:{port}"):
            ends_within(lambda: client.post([alert("OpsloopTrickleAlone")]))
        client.close()


def test_the_healthy_member_of_an_ha_pair_gets_the_page(test_alertmanager) -> None:  # type: ignore[no-untyped-def]
    with trickle_server() as port:
        client = AlertmanagerClient([f"http://127.0.0.1:{port}", am_url(test_alertmanager)], timeout_s=0.5)
        result = ends_within(lambda: client.post([alert("OpsloopTricklePair")]))
        client.close()
    assert result.accepted == 1 and result.rejected == []
    got = requests.get(f"{am_url(test_alertmanager)}/api/v2/alerts",
                       params={"filter": 'alertname="OpsloopTricklePair"'}, timeout=5).json()
    assert len(got) == 1
