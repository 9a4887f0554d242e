"""A hypervisor's firewall round split across two stream batches is still read as one round.

The collector publishes a round as records of the hypervisor's key, cut in halves when large
(``opsloop.collect.publisher.records_for``: order kept, ports first, then the ruleset and the package
samples), and the agent's batches may cut that record sequence anywhere. The handler built one report
per (hypervisor, time) per batch, and each report replaced the hypervisor's last one: the part with the
host-level sample (complete) read the ports of the earlier part as gone and cleared their findings (a
critical page closed, re-opened a round later), and a part of package samples alone replaced a report
carrying the ruleset (no fingerprint: its drift finding cleared). Now a later part of the same round is
added to the earlier one (``HypervisorReport.merged``), also across a restart between the parts (the
partial report is the hypervisor's state in the changelog), and a newer round still clears ports gone.
"""

from __future__ import annotations

import time
from typing import Sequence

import pytest
from prometheus_client import REGISTRY

from opsloop.collect.publisher import records_for
from opsloop.records import Metric, metric
from opsloop.streams.detectors.firewall.detector import (FINGERPRINT_DRIFT, PACKAGE_DRIFT, UNPROTECTED,
                                                         FirewallDetector, HypervisorReport, report_from_metrics)
from opsloop.streams.detectors.firewall.handler import FirewallHandler
from opsloop.streams.detectors.firewall.settings import FirewallSettings
from opsloop.streams.runtime.batch import FanOut, decode_and_handle

from tests.helpers import ConsumerMsg
from tests.streams.agents.test_handlers import iptables_round, restarted

HV = "split-hv"                      # the hypervisor whose round is split
PEERS = ("split-c1", "split-c2", "split-c3")   # its role's majority (base-a, neutron 2:9.4.1)
ROLES = {hv: "compute" for hv in (HV, *PEERS)}
# previous round: b protected, d and "gone" unprotected; the split round: b now unprotected, d still,
# "gone" no longer on the hypervisor (a genuinely newer round clears it)
BEFORE = {"a": True, "b": True, "c": True, "d": False, "gone": False}
SPLIT = {"a": True, "b": False, "c": True, "d": False}
SPLIT_SAMPLES = len(SPLIT) + 2   # its ports, the ruleset sample, the package sample
CUTS = range(1, SPLIT_SAMPLES)


class PoisonedFirewall(FirewallHandler):
    """The real handler with a bug only a sample tagged ``poison`` sets off (the runtime isolates it)."""

    def process(self, metrics: Sequence[Metric], now: float) -> None:
        if any(m.tags.get("poison") for m in metrics):
            raise RuntimeError("cannot handle this sample")
        super().process(metrics, now)


def _hv_round(ts: float, ports: dict[str, bool]) -> list[Metric]:
    return iptables_round(HV, ts, {f"{HV}-{p}": ok for p, ok in ports.items()}, base_fp="base-b", neutron="2:9.0.0")


def _peers_round(ts: float, poison: bool = False) -> list[Metric]:
    out: list[Metric] = []
    for hv in PEERS:
        rows = iptables_round(hv, ts, {f"{hv}-p": True})
        if poison and hv == PEERS[1]:
            rows[0] = metric(rows[0].name, rows[0].fields, {**rows[0].tags, "poison": "1"}, rows[0].timestamp)
        out += rows
    return out


def _records(samples: list[Metric], first_offset: int) -> list[ConsumerMsg]:
    """The samples as the collector publishes them, one record per sample here (a round cut in halves
    until each record is under the limit: the extreme of a large round), on one partition."""
    return [ConsumerMsg(r.topic, 0, first_offset + i, r.key.encode(), r.value)
            for i, r in enumerate(records_for(samples, limit=1))]


def _events(h: FirewallHandler) -> list[tuple[str, str, str]]:
    return [(e, f.detector, f.where.get("port", f.where["hypervisor"])) for e, f in h.drain_outbox()
            if f.where["hypervisor"] == HV]


def _open(h: FirewallHandler) -> set[tuple[str, str]]:
    return {(f.detector, f.where.get("port", f.where["hypervisor"])) for f in h.open_findings()
            if f.where["hypervisor"] == HV}


def _gauge(state: str) -> float | None:
    return REGISTRY.get_sample_value("opsloop_firewall_ports", {"hypervisor": HV, "role": "compute", "state": state})


def _start(handler: type[FirewallHandler]) -> tuple[FirewallHandler, float]:
    """A handler that has seen one whole round of every hypervisor: c d gone open, drift of HV open."""
    h = handler(FirewallSettings(roles=ROLES))
    t0 = float(int(time.time()) - 3600)
    batch = decode_and_handle("detectors", _records(_peers_round(t0) + _hv_round(t0, BEFORE), 0), FanOut("d", [h]))
    assert batch.deadletters == []
    assert _open(h) == {(UNPROTECTED, f"{HV}-d"), (UNPROTECTED, f"{HV}-gone"), (FINGERPRINT_DRIFT, HV),
                        (PACKAGE_DRIFT, HV)}
    h.drain_outbox()
    return h, t0 + 60


def _check_round(h: FirewallHandler, events: list[tuple[str, str, str]], t1: float) -> None:
    # b opened once, "gone" cleared once (a newer, complete round without it); no page closed and re-sent
    ports = sorted(e for e in events if e[1] == UNPROTECTED)
    assert ports == [("cleared", UNPROTECTED, f"{HV}-gone"), ("opened", UNPROTECTED, f"{HV}-b")], events
    # the drift warnings hold through both parts (a part without the ruleset or packages is no "in line")
    assert [e for e in events if e[1] != UNPROTECTED] == [], events
    assert _open(h) == {(UNPROTECTED, f"{HV}-b"), (UNPROTECTED, f"{HV}-d"), (FINGERPRINT_DRIFT, HV),
                        (PACKAGE_DRIFT, HV)}
    # the hypervisor's report is the whole round, as if it had come in one batch
    [whole] = report_from_metrics(_hv_round(t1, SPLIT), ROLES)
    assert h.detector.latest[HV].to_dict() == whole.to_dict()
    assert (_gauge("unprotected"), _gauge("protected")) == (2.0, 2.0)


@pytest.mark.parametrize("restart", [False, True], ids=["same-worker", "restart-between-parts"])
@pytest.mark.parametrize("cut", CUTS)
def test_a_round_split_across_batches_is_one_round(cut: int, restart: bool) -> None:
    h, t1 = _start(FirewallHandler)
    samples = _hv_round(t1, SPLIT)
    first, rest = samples[:cut], samples[cut:]
    # the peers' round rides with the first part: the role's drift is compared on both batches
    decode_and_handle("detectors", _records(_peers_round(t1) + first, 100), FanOut("d", [h]))
    events = _events(h)
    if not any(m.name == "iptables_ruleset" for m in first):
        # a partial round: it may open, never clear a port ("gone" may still be there)
        assert [e for e in events if e[1] == UNPROTECTED and e[0] != "opened"] == [], events
    if restart:   # the worker restarts between the parts: the partial round is the changelog's state
        h = restarted(h)   # type: ignore[assignment]
    batch = decode_and_handle("detectors", _records(rest, 200), FanOut("d", [h]))
    assert batch.deadletters == []
    events += _events(h)
    _check_round(h, events, t1)


@pytest.mark.parametrize("cut", CUTS)
def test_a_failure_in_the_second_part_batch_hands_back_the_part_and_keeps_the_round(cut: int) -> None:
    """``isolation_key`` (hypervisor, time): after a failure the part of the round in that batch is handed
    back as one unit and added to the first part like any later part (handled twice: the same round)."""
    h, t1 = _start(PoisonedFirewall)
    samples = _hv_round(t1, SPLIT)
    decode_and_handle("detectors", _records(samples[:cut], 100), FanOut("d", [h]))
    events = _events(h)
    batch = decode_and_handle("detectors", _records(samples[cut:] + _peers_round(t1, poison=True), 200),
                              FanOut("d", [h]))
    # only the poisoned peer's round is dead-lettered
    assert {d.key for d in batch.deadletters} == {PEERS[1].encode()}
    events += _events(h)
    _check_round(h, events, t1)


def test_parts_of_one_round_merge_in_the_detector_and_a_newer_round_replaces() -> None:
    det = FirewallDetector()
    t = 1_795_000_000.0
    first = HypervisorReport.from_dict({"hypervisor": "h", "timestamp": t, "complete": False, "ports": [
        {"port": "p1", "vm": "v1", "chain_present": False, "reason": "no ingress chain"},
        {"port": "p2", "vm": "v2", "chain_present": True}]})
    opened = det.update(first)
    assert [(f.where["port"], f.cleared) for f in opened] == [("p1", False)]
    rest = HypervisorReport.from_dict({"hypervisor": "h", "timestamp": t, "ruleset_fingerprint": "fp",
                                       "packages": {"iptables": "1.8"},
                                       "ports": [{"port": "p3", "vm": "v3", "chain_present": True}]})
    assert [f for f in det.update(rest) if f.cleared] == []
    merged = det.latest["h"]
    assert merged.complete and merged.ruleset_fingerprint == "fp" and merged.packages == {"iptables": "1.8"}
    assert merged.ports == {"p1": ("v1", False), "p2": ("v2", True), "p3": ("v3", True)}
    assert merged.reasons == {"p1": "no ingress chain"}
    # the state round-trips (the changelog), and a later part after the restart still adds to it
    det = FirewallDetector.from_dict(det.to_dict())
    assert det.latest["h"].to_dict() == merged.to_dict()
    # handed again (at-least-once, the runtime's isolation): the same round, nothing changes
    assert not any(f.cleared for f in det.update(first))
    assert det.latest["h"].to_dict() == merged.to_dict()
    # a newer complete round without p1: p1 is gone
    newer = HypervisorReport("h", "default", t + 60, {"p2": ("v2", True)}, "fp", {"iptables": "1.8"})
    assert [(f.where["port"], f.cleared) for f in det.update(newer)] == [("p1", True)]
    assert det.latest["h"].ports == {"p2": ("v2", True)}
