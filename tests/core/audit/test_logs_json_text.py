"""A library line whose text is itself JSON, through the real shippers with the configs as shipped.

opsloop's formatter puts a library logger's message in ``event`` (``record.getMessage()``): a client that
logs an answer body, a payload, a config dump, writes JSON text there. The shippers' ``decode_json_fields``
decoded ``message`` with ``max_depth: 3``, which also decodes every string value of the decoded line that
parses as JSON: ``opsloop.event`` became an object, Elasticsearch refused the document (400, an object for
a keyword) and the shipper dropped the line for good (a 400 is not retried), with a warning in its own log
only. ``max_depth: 1`` decodes the line itself; ``opsloop.fields`` is an object of the line, kept as it is.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import orjson
import pytest
import requests

from tests.core.audit.beats import (COMPOSE_DIR, LOGS_TEMPLATE_FILE, Entry, Journal, Scenario, beat_process, docs_with,
                                    es_front, opsloop_line, wait_until_)
from tests.helpers import unique

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("beat", ["filebeat", "journalbeat"])
def test_a_library_line_whose_text_is_json_is_shipped_with_its_event_as_text(
        beat: str, es_url: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    work: Path = tmp_path_factory.mktemp(f"{beat}-json-text")
    front, front_url = es_front(work / "front", es_url)
    front.start()
    run = unique(beat[:2]).replace("-", "")
    sc = Scenario(run)
    journal = Journal(work / "journal")
    proc = beat_process(beat, COMPOSE_DIR / f"{beat}.yml", work / beat, front_url, [
        f'{beat}.inputs.0.paths=["{journal.folder}"]', f"setup.template.json.path={LOGS_TEMPLATE_FILE}"])
    try:
        requests.delete(f"{es_url}/_index_template/opsloop-logs", timeout=30)
        proc.start()

        def probe_arrived() -> bool:
            journal.write([sc.probe()], append_to="probes.journal")
            return any(f"{run}p" in str(d.get("message")) for d in docs_with(es_url, run))

        wait_until_(probe_arrived, 180, f"{beat} to ship a first line (log {proc.logfile})", proc)
        texts = {"object": orjson.dumps({"status": "green", "run": run, "shards": {"active": 5}}).decode(),
                 "array": orjson.dumps([{"run": run}, "x"]).decode()}
        now = time.time()
        lines = [opsloop_line("edge", logging.WARNING, text, now, id=f"{run}-{kind}") for kind, text in texts.items()]
        after = opsloop_line("edge", logging.INFO, "after_json_text", now, run=run, id=f"{run}-after")
        journal.write([Entry(m, sc.edge_ident, "opsloop-edge.service") for m in (*lines, after)])

        # Shipped in journal order: once the line written after them is in, they were sent too.
        wait_until_(lambda: any(f"{run}-after" in str(d.get("message")) for d in docs_with(es_url, run)), 180,
                    f"{beat} to ship the line written after the JSON-text lines", proc)
        events = {d["opsloop"]["fields"]["id"]: d["opsloop"]["event"] for d in docs_with(es_url, run)
                  if "fields" in d.get("opsloop", {})}
        for kind, text in texts.items():
            assert events.get(f"{run}-{kind}") == text, (kind, events, proc.tail(20))
    finally:
        proc.stop()
        front.stop()
