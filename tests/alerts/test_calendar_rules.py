"""The rules in a real Prometheus: every group loads and evaluates, and the Keystone nightly
window (03:10-04:10 Europe/Zurich, computed in PromQL with the EU summer-time rule) agrees with
Python's zoneinfo at any instant from 2000 to 2099."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import requests
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import REPO, prom_query, wait_until

pytestmark = pytest.mark.integration
ZURICH = ZoneInfo("Europe/Zurich")
RULE_FILES = sorted((REPO / "alerts" / "rules").glob("*.yml"))


def recording_exprs() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "alerts" / "rules" / "recording.yml").read_text())
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def inline(name: str, exprs: dict[str, str]) -> str:
    """A recording rule's expression with the recorded series it uses replaced by their expressions,
    so it can be evaluated at any instant (recorded series exist only for times already evaluated)."""
    expr = exprs[name]
    for other in exprs:
        if other != name and other in expr:
            expr = re.sub(rf"(?<![\w:]){re.escape(other)}(?![\w:])", f"({inline(other, exprs)})", expr)
    return expr


WINDOW = inline("opsloop:keystone_accounting_window:bool", recording_exprs())


def in_window_at(prometheus_url: str, instant: datetime) -> float:
    r = requests.get(f"{prometheus_url}/api/v1/query", params={"query": WINDOW, "time": instant.timestamp()},
                     timeout=5)
    r.raise_for_status()
    result = r.json()["data"]["result"]
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def expected(instant: datetime) -> float:
    local = instant.astimezone(ZURICH)
    return 1.0 if time(3, 10) <= local.time() < time(4, 10) else 0.0


def test_every_rule_group_loads_and_evaluates(stack) -> None:
    names = {g["name"] for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"]}

    def groups() -> dict[str, list[dict]]:
        r = requests.get(f"{stack.prometheus_url}/api/v1/rules", timeout=5).json()
        return {g["name"]: g["rules"] for g in r["data"]["groups"]}

    loaded = wait_until(lambda: (g := groups()) and names <= set(g) and
                        all(r.get("lastEvaluation", "").startswith("2") and not r["lastEvaluation"].startswith("0001")
                            for rules in g.values() for r in rules) and g,
                        timeout=60, what="all rule groups evaluated")
    errors = [(r["name"], r.get("lastError")) for rules in loaded.values() for r in rules if r["health"] == "err"]
    assert errors == []
    # The always-firing watchdog proves the alerting rules run.
    wait_until(lambda: prom_query(stack.prometheus_url, 'ALERTS{alertname="OpsloopWatchdog",alertstate="firing"}'),
               timeout=30, what="watchdog firing")


@pytest.mark.parametrize("instant", [
    datetime(2026, 3, 28, 2, 9, tzinfo=timezone.utc),    # Sat before the switch: 03:09 CET
    datetime(2026, 3, 28, 2, 10, tzinfo=timezone.utc),   # 03:10 CET
    datetime(2026, 3, 29, 1, 10, tzinfo=timezone.utc),   # switch Sunday: 03:10 CEST
    datetime(2026, 3, 29, 2, 10, tzinfo=timezone.utc),   # 04:10 CEST: over
    datetime(2026, 10, 25, 1, 30, tzinfo=timezone.utc),  # back to CET at 01:00Z: 02:30 CET
    datetime(2026, 10, 25, 2, 30, tzinfo=timezone.utc),  # 03:30 CET
    datetime(2028, 2, 29, 2, 59, tzinfo=timezone.utc),   # leap day
])
def test_window_at_the_switches(stack, instant: datetime) -> None:
    assert in_window_at(stack.prometheus_url, instant) == expected(instant)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(day=st.dates(min_value=date(2000, 1, 1), max_value=date(2099, 12, 30)),
       minute=st.one_of(st.integers(0, 1439), st.sampled_from([189, 190, 191, 249, 250, 251])))
def test_window_matches_zoneinfo(stack, day: date, minute: int) -> None:
    local = datetime.combine(day, time(0, 0), tzinfo=ZURICH) + timedelta(minutes=minute)
    instant = local.astimezone(timezone.utc)
    assert in_window_at(stack.prometheus_url, instant) == expected(instant), instant.isoformat()
