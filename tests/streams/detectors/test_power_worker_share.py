"""With several stream workers each reads the ``telemetry.ipmi`` partitions it holds. A reading that carries its
server's generation (the IPMI collector's inventory metadata) is keyed by the generation (``opsloop.topics``
``TOPIC_KEY_TAGS``), so a generation's servers reach one worker and its median is of all of them: the same
findings as one worker. Before, readings were keyed by host: each worker's median was of the servers of its
partitions, and a share whose majority deviated flagged its healthy servers. A reading without the tag (its
generation only in ``streams.detectors.power.hosts``) keeps its host key: compared within its worker's share,
a documented limit (docs/operations.md, "Running N stream workers"), its explanation naming the count.

Two workers are simulated here by Kafka's partitioner (``partition_of``, kafka-python's murmur2, as the
collectors' producer) over 4 partitions, a handler per worker; ``test_power_two_workers.py`` runs two real
workers on the test stack's Kafka."""

from __future__ import annotations

import itertools

from opsloop.records import Finding, Metric, metric
from opsloop.streams.detectors.power.handler import PowerHandler
from opsloop.streams.detectors.power.settings import PowerHost, PowerSettings
from tests.scale.workload import partition_of

T0 = 1_795_500_000.0
DEVIATION = "power.generation_deviation"
WORKERS = ({0, 1}, {2, 3})   # the partitions each of two workers holds


def _host_on(prefix: str, partitions: set[int], taken: set[str]) -> str:
    """A host name keyed (by itself) to one of ``partitions``."""
    for n in itertools.count():
        name = f"{prefix}{n}"
        if name not in taken and partition_of(name) in partitions:
            taken.add(name)
            return name
    raise AssertionError("unreachable")


# x, y: fans at full speed; as keyed by host, a, x and y land on worker 0's partitions, the rest on worker 1's
_TAKEN: set[str] = set()
A, X, Y = (_host_on(f"stor-{n}-", WORKERS[0], _TAKEN) for n in "axy")
B, C, Z = (_host_on(f"stor-{n}-", WORKERS[1], _TAKEN) for n in "bcz")
FLEET = {A: 205.0, B: 200.0, C: 210.0, Z: 205.0, X: 320.0, Y: 325.0}


def _round(t: float, tagged: bool) -> list[Metric]:
    tags = {"generation": "gen2", "raw_capacity_tb": "48"} if tagged else {}
    return [metric("ipmi_power", {"watts": w}, {"host": h, **tags}, t) for h, w in FLEET.items()]


def _settings(tagged: bool) -> PowerSettings:
    # untagged: the generation and capacity only in the detector's config
    return PowerSettings() if tagged else PowerSettings(hosts={h: PowerHost(generation="gen2", raw_tb=48)
                                                               for h in FLEET})


def _deviations(workers: list[set[int]] | None, tagged: bool) -> dict[str, Finding]:
    """Open deviation findings by host over the workers (None: one worker holding every partition)."""
    shares = [set(range(4))] if workers is None else workers
    handlers = [PowerHandler(_settings(tagged)) for _ in shares]
    for i in range(5):
        t = T0 + 60 * i
        batch = _round(t, tagged)
        for h, held in zip(handlers, shares):
            h.handle([m for m in batch if partition_of(m.key) in held], t)
    found = [f for h in handlers for f in h.open_findings() if f.detector == DEVIATION]
    assert len({f.where["host"] for f in found}) == len(found), "a host's deviation shown by two workers"
    return {f.where["host"]: f for f in found}


def test_one_worker_compares_the_whole_generation_and_says_so() -> None:
    found = _deviations(None, tagged=True)
    assert sorted(found) == sorted([X, Y])
    assert "median 208 W of the 6 servers compared" in found[X].explanation


def test_two_workers_compare_a_generation_whose_readings_carry_it_whole() -> None:
    assert len({partition_of(m.key) for m in _round(T0, tagged=True)}) == 1   # one key: the generation
    found = _deviations(list(WORKERS), tagged=True)
    # was (keyed by host): worker 0 flagged A against the median of A, X, Y; X and Y were flagged by nobody
    assert sorted(found) == sorted([X, Y])
    assert "median 208 W of the 6 servers compared" in found[X].explanation


def test_readings_without_their_generation_are_compared_within_their_workers_share_and_say_so() -> None:
    assert sorted(_deviations(None, tagged=False)) == sorted([X, Y])   # one worker: exact from the config too
    found = _deviations(list(WORKERS), tagged=False)
    assert sorted(found) == [A], "the documented limit: the share's median is the deviating servers'"
    assert "of the 3 servers compared" in found[A].explanation
