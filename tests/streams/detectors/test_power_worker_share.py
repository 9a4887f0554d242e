"""With several stream workers a generation's servers are split between them (``telemetry.ipmi`` records are keyed
by host, so each worker reads the hosts of its partitions), and each worker's power detector compares the servers
it reads: the median is of its share. A known limit (docs/operations.md, "Running N stream workers"): the finding
says of how many servers its median is, so on-call sees a share too small or too skewed to trust. Before, its
explanation did not say, and a healthy server flagged against a share whose majority deviated read as a fault of
that server."""

from __future__ import annotations

from opsloop.records import Metric, metric
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerSettings

T0 = 1_795_500_000.0
DEVIATION = "power.generation_deviation"
FLEET = {"a": 205.0, "b": 200.0, "c": 210.0, "z": 205.0, "x": 320.0, "y": 325.0}   # x, y: fans at full speed


def _round(t: float, hosts: dict[str, float]) -> list[Metric]:
    return [metric("ipmi_power", {"watts": w}, {"host": h, "generation": "gen2", "raw_capacity_tb": "48"}, t)
            for h, w in hosts.items()]


def _run(hosts: dict[str, float]) -> PowerHandler:
    h = PowerHandler(PowerSettings())
    for i in range(5):
        h.handle(_round(T0 + 60 * i, hosts), T0 + 60 * i)
    return h


def test_one_worker_compares_the_whole_generation_and_says_so() -> None:
    found = {f.where["host"]: f for f in _run(FLEET).open_findings() if f.detector == DEVIATION}
    assert sorted(found) == ["x", "y"]
    assert "median 208 W of the 6 servers compared" in found["x"].explanation


def test_a_worker_with_a_share_of_the_generation_names_the_share_its_median_is_of() -> None:
    share = {h: FLEET[h] for h in ("a", "x", "y")}   # this worker's partitions: two of them deviate
    found = {f.where["host"]: f for f in _run(share).open_findings() if f.detector == DEVIATION}
    assert sorted(found) == ["a"], "the documented limit: the share's median is the deviating servers'"
    assert "of the 3 servers compared" in found["a"].explanation
