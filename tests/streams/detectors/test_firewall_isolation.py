"""A poison sample in the firewall detector's batch costs its hypervisor's round, not the other rounds' findings.

The firewall handler reads a hypervisor's round (its port samples, its ruleset sample, its package samples,
one timestamp) as one report; only a round with its host-level sample clears the findings of ports missing
from it. When the handler raised on a batch, the runtime handed its samples back one at a time: each
ruleset sample then read as a complete round without ports (every unprotected-port finding of that
hypervisor cleared, then re-opened by the next sample: a critical page closed and re-sent), and the last
single sample became the hypervisor's report (no fingerprint, no packages: drift findings cleared, a
state of one port written to the table). Now the handler names the unit it reads (``isolation_key``: the
hypervisor and the round's time) and the runtime hands the samples back a round at a time."""

from __future__ import annotations

import time
from typing import Sequence

from opsloop.records import Metric, metric
from opsloop.streams.detectors.firewall.detector import PACKAGE_DRIFT, FINGERPRINT_DRIFT, UNPROTECTED
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.firewall.settings import FirewallSettings
from opsloop.streams.runtime.batch import FanOut, decode_and_handle
from opsloop.wire import encode_batch

from tests.helpers import ConsumerMsg
from tests.streams.agents.test_handlers import iptables_round

HVS = ("c1", "c2", "c3", "c4")


class PoisonedFirewall(FirewallHandler):
    """The real handler with a bug that only one sample (tagged ``poison``) sets off."""

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        if any(m.tags.get("poison") for m in metrics):
            raise RuntimeError("cannot handle this sample")
        super().process(metrics, now)


def _round(ts: float, poison: str | None = None) -> list[ConsumerMsg]:
    """One record per hypervisor (the collector's batch per target): c1 has an unprotected port, c3 another
    ruleset, c4 another neutron; ``poison`` names the hypervisor one of whose port samples is poisoned."""
    msgs = []
    for i, hv in enumerate(HVS):
        rows = iptables_round(hv, ts, {f"{hv}-p1": hv != "c1", f"{hv}-p2": True},
                              base_fp="base-b" if hv == "c3" else "base-a",
                              neutron="2:9.0.0" if hv == "c4" else "2:9.4.1")
        if hv == poison:
            rows[1] = metric(rows[1].name, rows[1].fields, {**rows[1].tags, "poison": "1"}, rows[1].timestamp)
        msgs.append(ConsumerMsg("telemetry.iptables", 0, int(ts) % 100_000 * 10 + i, hv.encode(), encode_batch(rows)))
    return msgs


def _open(h: FirewallHandler) -> set[tuple[str, str]]:
    return {(f.detector, f.where.get("port", f.where["hypervisor"])) for f in h.open_findings()}


def test_a_poison_sample_costs_its_round_and_no_other_finding_moves() -> None:
    h = PoisonedFirewall(FirewallSettings(roles={hv: "compute" for hv in HVS}))
    fan = FanOut("detectors", [h])
    t0 = float(int(time.time()) - 600)
    batch = decode_and_handle("detectors", _round(t0), fan)
    assert batch.deadletters == []
    expected = {(UNPROTECTED, "c1-p1"), (FINGERPRINT_DRIFT, "c3"), (PACKAGE_DRIFT, "c4")}
    assert _open(h) == expected
    h.drain_outbox()
    first = {hv: h.detector.latest[hv].to_dict() for hv in HVS}

    msgs = _round(t0 + 60, poison="c2")
    batch = decode_and_handle("detectors", msgs, fan)

    # no finding cleared and re-opened (a critical page closed and sent again), none cleared for good
    events = [(e, f.detector, f.where["hypervisor"]) for e, f in h.drain_outbox()]
    assert [e for e in events if e[0] in ("cleared", "opened")] == [], events
    assert _open(h) == expected
    # the other hypervisors' reports are their whole round of t0 + 60; c2 keeps its last good one
    for hv in ("c1", "c3", "c4"):
        rep = h.detector.latest[hv].to_dict()
        assert rep == {**first[hv], "timestamp": t0 + 60}, hv
    assert h.detector.latest["c2"].to_dict() == first["c2"]
    # the poisoned round is dead-lettered whole, each sample with its record's place; nothing else is
    c2_samples = len(iptables_round("c2", t0, {"a": True, "b": True}))
    assert len(batch.deadletters) == c2_samples
    assert {(d.key, d.offset) for d in batch.deadletters} == {(b"c2", msgs[1].offset)}
    assert all("cannot handle this sample" in d.reason for d in batch.deadletters)
