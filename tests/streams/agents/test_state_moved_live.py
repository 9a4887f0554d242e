"""A detector state key whose records move partition, on the real path: a real worker, its ``detector-state``
changelog on the test stack's broker (the table-level cases: ``test_state_newest_copy.py``).

Seen on ``make run``: ``telemetry.ipmi`` keyed by generation instead of host moved ``power-detector|stor-gen1-000``
from partition 2 to 3. Its old copy was deleted only under an event of the old partition, and partition 2 got no
more of its records: it kept the copy for good (144 records, no tombstone, beside 65 in partition 3), every restart
logged ``state_home_moved`` again, and Faust's recovery, one dict for every partition, kept the copy it read last:
possibly the state from before the move. Here a Keystone host's records go to partition 1, then, after a restart,
to partition 0 only.
Now: the old copy's tombstone goes straight to partition 1; a recovery keeps the newer copy in either order."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import faust
import orjson
import pytest
from faust.types.tuples import ConsumerMessage
from kafka import KafkaProducer

from opsloop.records import Metric
from opsloop.streams.agents.stateful import STATE_TABLE, state_table
from opsloop.wire import encode_batch
from tests.helpers import read_topic, unique, wait_until
from tests.streams.agents.test_state_newest_copy import Record
from tests.streams.detectors.test_keystone_state_bounds_live import Run, _cred

pytestmark = pytest.mark.integration


def _send_to(run: Run, partition: int, host: str, batch: list[Metric]) -> None:
    """``host``'s records to ``partition`` (as a record key change, a partition count change, would send them)."""
    producer = KafkaProducer(bootstrap_servers=run.bootstrap, acks="all")
    try:
        producer.send(run.topic, key=host.encode(), value=encode_batch(batch), partition=partition)
        producer.flush()
    finally:
        producer.close()


def _copies(run: Run, host: str) -> tuple[dict[int, dict[str, Any] | None], list[Any]]:
    """The host's latest changelog record per partition (None: a tombstone), and all its records."""
    key = orjson.dumps(f"keystone-detector|{host}")
    mine = [r for r in read_topic(run.bootstrap, f"{run.group}-{STATE_TABLE}-changelog") if r.key == key]
    latest: dict[int, dict[str, Any] | None] = {}
    for r in mine:
        latest[r.partition] = orjson.loads(r.value) if r.value is not None else None
    return latest, mine


def test_a_key_whose_records_moved_keeps_one_live_copy_and_a_restart_the_newer(stack: Any, tmp_path: Path) -> None:
    run = Run(stack, tmp_path)
    assert run.doc["kafka"]["partitions"] >= 2
    host = unique("rgw-moved")
    t0 = time.time() - 300
    worker = run.start()
    try:
        _send_to(run, 1, host, [_cred(host, "AKIAOLD", t0, 3)])
        wait_until(lambda: run.window(host) == 3, timeout=60, what="the host's first round handled")
        wait_until(lambda: _copies(run, host)[0].get(1), timeout=30, what="its state in changelog partition 1")
        # a restart (a deploy): the host's state recovered from partition 1, which gets none of its records again
        wait_until(run.committed, timeout=60, what="the round's offset committed")
        worker.stop()
        worker = run.start()
        # its records now come to partition 0 only: the worker has no event of partition 1 to delete the copy under
        _send_to(run, 0, host, [_cred(host, "AKIANEW", t0 + 60, 5)])
        wait_until(lambda: run.window(host) == 8, timeout=90, what="the round from partition 0 handled (restored: 3)")
        latest, records = wait_until(lambda: (c := _copies(run, host))[0].get(0) and c, timeout=30,
                                     what="its state in changelog partition 0")
        # one live copy: the old one's tombstone in partition 1 (was: the copy from before the move, for good)
        latest, records = wait_until(lambda: (c := _copies(run, host))[0].get(1, 0) is None and c, timeout=15,
                                     what="the old copy in partition 1 deleted")
        assert set(latest) == {0, 1} and latest[0] is not None
        # restarted again, the worker restores the newer copy (a probe's batch triggers the restore)
        worker = run.restart_and_restore(worker)
        assert run.window(host) == 8
    finally:
        worker.stop()
    # A restart's recovery of these very records, a partition at a time, in either order: the newer copy (was:
    # the copy recovered last, the state before the move when partition 1 came last)
    newest = orjson.dumps(latest[0])
    for order in ([0, 1], [1, 0]):
        table = state_table(faust.App(f"moved-live-{order[0]}", broker="kafka://127.0.0.1:1"))
        for p in order:
            table.apply_changelog_batch([_as_recovered(r) for r in records if r.partition == p])
        assert orjson.dumps(table[f"keystone-detector|{host}"]) == newest, order
        assert table.stale_copies() == {}, order       # nothing left for a restart to delete


def _as_recovered(r: Any) -> Record:
    """A changelog record as read from the broker, as Faust's recovery hands it to the table."""
    rec = Record(orjson.loads(r.key), orjson.loads(r.value) if r.value is not None else None, r.partition, r.offset,
                 r.timestamp)
    rec.message = ConsumerMessage(r.topic, r.partition, r.offset, r.timestamp / 1000.0, r.timestamp_type, [],
                                  r.key, r.value, None)
    return rec
