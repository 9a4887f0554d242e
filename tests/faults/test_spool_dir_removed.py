"""The spool directory is removed while the collector runs (a tmpfiles clean-up, an operator's `rm -rf`).

Every later segment write failed with FileNotFoundError until a restart: during a broker outage the rounds
were held in memory only (lost past MEMORY_MAX_BYTES) and lost at the next stop, since close() could not
spool them either. The spool now makes its directory again on the next write and counts the records that
went with the old one as dropped.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from opsloop.collect.publisher import Publisher
from opsloop.collect.spool import Record, Spool
from tests.helpers import wait_until


def recs(*vals: int) -> list[Record]:
    return [Record("telemetry.lb", f"k{v}", f'{{"v":{v}}}'.encode()) for v in vals]


def drain_keys(sp: Spool) -> list[str]:
    out = []
    while (item := sp.oldest()) is not None:
        path, rs = item
        out += [r.key for r in rs]
        sp.complete(path, [])
    return out


def test_a_removed_spool_directory_is_made_again_and_its_loss_counted(tmp_path: Path) -> None:
    spool_dir = tmp_path / "spool" / "lvs"
    sp = Spool(spool_dir, max_bytes=1 << 20)
    sp.append(recs(1, 2))
    shutil.rmtree(tmp_path / "spool")
    sp.append(recs(3))                      # raised FileNotFoundError, on every later append too
    sp.append(recs(4))
    assert sp.dropped_records == 2          # the two records that went with the directory
    assert sp.count_records() == 2 and sp.size_bytes() == sum(p.stat().st_size for p in spool_dir.glob("*.jsonl"))
    assert drain_keys(sp) == ["k3", "k4"] and sp.empty()


def test_rounds_of_a_broker_outage_survive_the_spool_directory_removed_and_a_restart(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]            # closed again: the broker is away
    spool_dir = tmp_path / "spool" / "lvs"
    pub = Publisher(f"127.0.0.1:{port}", spool_dir, collector="spool-dir-removed-test", send_timeout_s=1.0)
    try:
        pub.publish(recs(1))
        wait_until(lambda: list(spool_dir.glob("*.jsonl")), timeout=30, interval=0.05,
                   what="the first round spooled after its failed send")
        shutil.rmtree(tmp_path / "spool")
        pub.publish(recs(2))
        pub.publish(recs(3))
    finally:
        pub.close(timeout_s=0)               # a stop while the broker is still away
    # the next start replays the outage's rounds from disk
    assert drain_keys(Spool(spool_dir, max_bytes=1 << 20)) == ["k2", "k3"]
