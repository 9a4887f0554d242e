"""The chaos soak, short variant (bench/bench_soak.py QUICK: each service SIGKILLed once, the broker and
Alertmanager restarted once, a power jump and a deleted chain injected and repaired).

Everything is real and supervised as in `make run`. Waits are event-driven with generous limits; nothing
asserts on a duration (the recovery times are printed, the bench records them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_soak import QUICK, soak

pytestmark = pytest.mark.integration


@pytest.mark.timeout(2400)
def test_soak_every_kill_recovers_nothing_lost_pages_once_weights_safe(tmp_path: Path, capsys) -> None:
    lines: list[str] = []

    def echo(msg: str) -> None:
        lines.append(msg)
        with capsys.disabled():
            print(msg, flush=True)

    res = soak(tmp_path, QUICK, echo=echo)
    report = res.table()
    assert len(res.kills) == 9, report
    assert [k.target for k in res.kills if k.recovered_s is None] == [], report
    assert res.problems_ok() == {"power jump": True, "deleted chain": True}, report
    assert res.series > 0 and res.samples > 0, report
    assert res.lost_in_worker == {} and res.collector_gaps == {}, report
    assert res.weight_samples > 0 and res.unsafe_weights == [], report
    assert res.restarts >= 7, report   # every SIGKILLed service came back through the supervisor
