"""A where-label value over the old stream-side cut (128 characters) pages once: the paging actuator's alert and the
rule backstop built from the stream worker's ``opsloop_finding_active`` carry the same value, so Alertmanager's
inhibition (``equal`` on the where-labels, alerts/alertmanager.yml) mutes the backstop.

Before, the worker cut the value to its first 128 characters and the actuator to 256 (a prefix and a hash): for a
value between the two (or longer) the two alerts differed in that label, the backstop was not inhibited, and one
finding paged twice under two labels. Both now use :func:`opsloop.labels.shorten` (one bound, one place).
Real Alertmanager with alerts/alertmanager.yml (tests/alerting.py).
"""

from __future__ import annotations

import pytest

from opsloop.controllers.paging.mapping import labels_for
from opsloop.labels import MAX_LABEL_VALUE
from opsloop.records import Finding
from opsloop.stack import ManagedProcess
from opsloop.streams.agents.findings_sink import finding_labels
from tests.alerting import WebhookReceiver
from tests.controllers.paging.test_backstop_inhibition import (actuator_alert, critical_finding_backstop, delivered,
                                                               finding, inhibited_by, post)
from tests.helpers import unique, wait_until

pytestmark = pytest.mark.integration


def long_series(n: int) -> str:
    return (unique("series") + "-" + "x" * n)[:n]


@pytest.mark.parametrize("length", [129, 200, 256, 257, 1000])
def test_the_exported_and_the_paged_where_value_are_one_value(length: int) -> None:
    f = finding("anomaly.haproxy_rate", {"metric": "haproxy", "series": long_series(length), "vm": "web-1"})
    exported, paged = finding_labels(f), labels_for(f)
    assert exported["series"] == paged["series"] and len(paged["series"]) <= MAX_LABEL_VALUE
    assert (paged["series"] == f.where["series"]) == (length <= MAX_LABEL_VALUE)
    # two values that differ past the cut stay two series and two alerts
    other: Finding = finding(f.detector, {**f.where, "series": f.where["series"][:-1] + "y"})
    assert finding_labels(other)["series"] != exported["series"]


def test_a_page_with_a_long_where_value_mutes_its_own_backstop(test_alertmanager: ManagedProcess,
                                                               webhook: WebhookReceiver) -> None:
    paged = finding(f"anomaly.haproxy_{unique('d')[2:]}", {"metric": "haproxy", "field": "rate",
                                                           "series": long_series(200)})
    backstop = critical_finding_backstop(paged)
    post(test_alertmanager, [actuator_alert(paged), backstop])
    wait_until(lambda: inhibited_by(test_alertmanager, backstop["labels"]), timeout=30,
               what="the backstop of the paged finding inhibited by its page")
    assert not delivered(webhook, "/page", backstop["labels"])
