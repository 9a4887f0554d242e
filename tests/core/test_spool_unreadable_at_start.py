"""The spool opened over what it cannot read: a collector must start, replay the good segments and say what it
moved aside. A segment that could not be read (here: a directory under a segment's name, an OSError on open as a
disk error is) or a leftover ``*.tmp`` that is not a file raised from ``Spool()``: the publisher, and with it the
collector, failed at every start, the spooled rounds of an outage with it.
"""

from __future__ import annotations

from pathlib import Path

from opsloop.collect.spool import QUARANTINE_DIR, Record, Spool
from tests.core.test_spool import drain_all
from tests.helpers import captured_logs


def recs(*vals: int) -> list[Record]:
    return [Record("telemetry.lb", f"k{v}", f'{{"v":{v}}}'.encode()) for v in vals]


def test_an_unreadable_segment_is_quarantined_and_the_good_ones_replayed(tmp_path: Path) -> None:
    first = Spool(tmp_path, 1 << 20)
    first.append(recs(1, 2))
    first.append(recs(3))
    (tmp_path / f"{5:012d}.jsonl").mkdir()   # after them: its number must not be written over either
    with captured_logs() as logs:
        sp = Spool(tmp_path, 1 << 20)
    assert any(line.startswith("spool_segment_unreadable") and f"{5:012d}.jsonl" in line for line in logs.lines)
    assert (tmp_path / QUARANTINE_DIR / f"{5:012d}.jsonl.bad").is_dir()
    assert sp.count_records() == 3
    sp.append(recs(4))
    assert drain_all(sp) == recs(1, 2, 3, 4)
    assert sp.empty() and sp.count_records() == 0


def test_a_temporary_name_that_is_not_a_file_does_not_stop_the_start(tmp_path: Path) -> None:
    Spool(tmp_path, 1 << 20).append(recs(1))
    (tmp_path / f"{1:012d}.jsonl.tmp").mkdir()
    with captured_logs() as logs:
        sp = Spool(tmp_path, 1 << 20)
    assert any(line.startswith("spool_file_quarantined") for line in logs.lines)
    assert not (tmp_path / f"{1:012d}.jsonl.tmp").exists()
    sp.append(recs(2))
    assert drain_all(sp) == recs(1, 2)
