"""A detector state too large for one Kafka record, on the real path: a real worker, its ``detector-state``
changelog on the test stack's broker.

Valid config builds it: the Keystone heavy-hitter window at 120 panes of 10 s (``heavy_window_s: 1200``), each
pane's 64 counters full of long access keys, makes one host's state ~1.3 MB, above Faust's
``producer_max_request_size`` (1,000,000 bytes).

Before (old code): its changelog write raised ``MessageSizeTooLargeError`` in Faust's producer buffer
(``ProducerBuffer: Crashed reason=ProducerSendError``, ``We experienced a crash!``): the worker exited with every
detector. The flood's offsets were committed on the way down all the same (seen here: a restart did not replay
it), so the state writes of that batch were lost: the key back to an older copy or none, to crash again once grown.
Now: the write is measured as the producer will weigh it and not sent; the state stays in memory (log
``state_too_large``, ``opsloop_stream_state_dropped_total{reason="too_large"}``, alert OpsloopStreamStateTooLarge);
the other keys of the same batch are written, the offsets committed and the next records handled."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from opsloop.streams.agents.stateful import STATE_TABLE
from tests.helpers import read_topic, scrape_metric, unique, wait_until, write_config
from tests.streams.detectors.test_keystone_state_bounds_live import RECORD_LIMIT, Run, _cred

pytestmark = pytest.mark.integration

PANES, PANE_S, COUNTERS = 120, 10, 64   # a window of 120 panes, each of the Space-Saving sketch's 64 counters


def _changelog(run: Run) -> dict[bytes, tuple[int, dict[str, Any] | None]]:
    """Each key's latest changelog record: its size and value."""
    out: dict[bytes, tuple[int, dict[str, Any] | None]] = {}
    for r in read_topic(run.bootstrap, f"{run.group}-{STATE_TABLE}-changelog"):
        out[r.key] = (len(r.value or b""), orjson.loads(r.value) if r.value else None)
    return out


def _key(host: str) -> bytes:
    return orjson.dumps(f"keystone-detector|{host}")


def test_a_state_too_large_for_kafka_stays_in_memory_and_the_worker_goes_on(stack: Any, tmp_path: Path) -> None:
    run = Run(stack, tmp_path)
    run.doc["streams"]["detectors"] = {"keystone": {"heavy_pane_s": PANE_S, "heavy_window_s": PANES * PANE_S}}
    write_config(run.config, run.doc)
    big, good, later = unique("rgw-big"), unique("rgw-good"), unique("rgw-later")
    t0 = time.time() - 1800
    t0 -= t0 % 60
    flood = [_cred(big, f"AK{p:03d}{i:03d}" + "k" * 110, t0 + PANE_S * p)
             for p in range(PANES) for i in range(COUNTERS)]
    # the good host's round in the flood's last record: handled, and its state written, in the batch whose
    # write of the big host's state is refused
    chunks = [flood[i:i + 2048] for i in range(0, len(flood), 2048)]
    chunks[-1].append(_cred(good, "AKIAGOOD", t0 + PANE_S * PANES, 7))
    worker = run.start()
    try:
        def seen(host: str, value: float) -> bool:
            assert worker.running(), f"the worker exited: {worker.tail(40)}"
            return run.window(host) == value
        run.send([(big, chunk) for chunk in chunks])
        wait_until(lambda: seen(good, 7), timeout=90, what="the good host's round after the flood handled")
        assert run.window(big) == PANES * COUNTERS * 3   # the big host's state whole, in memory
        # the crash came right after the batch that set the gauges
        refused = wait_until(lambda: worker.running() and scrape_metric(
            run.port, "opsloop_stream_state_dropped_total", {"handler": "keystone-detector", "reason": "too_large"}),
            timeout=30, what="the refused write counted, the worker running")
        assert refused >= 1, worker.tail(40)
        log = worker.logfile.read_text()
        line = next(orjson.loads(x)["fields"] for x in log.splitlines() if '"event":"state_too_large"' in x)
        assert (line["handler"], line["state_key"], line["limit"]) == ("keystone-detector", big, RECORD_LIMIT), line
        assert line["size"] > RECORD_LIMIT, line
        assert "MessageSizeTooLarge" not in log and "We experienced a crash" not in log

        # the good host's state written beside the refused one; nothing over the limit reached the changelog
        changelog = wait_until(lambda: (c := _changelog(run)).get(_key(good)) and c, timeout=30,
                               what="the good host's state in the changelog")
        assert changelog[_key(good)][1] is not None
        assert all(size < RECORD_LIMIT for size, _ in changelog.values())
        # the batch's offsets committed (a restart does not replay it), and the next records handled and written
        wait_until(run.committed, timeout=60, what="the flood's offsets committed")
        run.send([(big, [_cred(later, "AKIALATER", t0 + PANE_S * PANES + 5, 5)])])
        wait_until(lambda: seen(later, 5), timeout=60, what="a record after the refused write handled")
        wait_until(lambda: _changelog(run).get(_key(later)), timeout=30, what="its state written")
        assert worker.running(), f"the worker exited: {worker.tail(40)}"
    finally:
        worker.stop()
