"""Real journal files, a real log shipper and what arrived in Elasticsearch, for the log tests.

* :class:`Journal` writes entries as Journal Export Format records through Debian's
  ``systemd-journal-remote``: real journal files (the format journald writes) without a journald.
* :class:`Scenario` and :func:`ship_across_a_restart`: the lines of one host (opsloop's units,
  Horizon, cron/sshd) and the stop-write-restart sequence both shippers go through.
* :func:`beat_process` runs Filebeat or Journalbeat (built by setup.d/80-beats.sh) with the very
  config file that ships in docker-compose/, overriding only paths and hosts.
* :func:`es_front` is HAProxy in front of the test Elasticsearch. Beats first ask ``GET /`` for the
  version; the integ-test Elasticsearch zip the tests run answers that call 405 (a real cluster
  answers it). The front answers only that call, with the version of the Elasticsearch behind it,
  and forwards everything else unchanged.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from opsloop.log import JsonFormatter
from opsloop.stack import ManagedProcess, free_port
from opsloop.stack.elasticsearch import ES_VERSION
from tests.helpers import REPO, wait_until

BEATS_DIR = REPO / ".cache" / "beats"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
COMPOSE_DIR = REPO / "docker-compose"
LOGS_TEMPLATE_FILE = REPO / "opsloop" / "audit" / "templates" / "logs.json"
UNITS_DIR = REPO / "deploy" / "systemd"


def syslog_identifier(unit_file: Path) -> str:
    """The SyslogIdentifier= an installed unit gives its lines in the journal."""
    for line in unit_file.read_text().splitlines():
        if line.startswith("SyslogIdentifier="):
            return line.split("=", 1)[1].strip()
    raise AssertionError(f"{unit_file.name}: no SyslogIdentifier=")


def require_tools(beat: str) -> Path:
    """The beat's binary; fails (no skip) naming the set-up step that provides what is missing."""
    binary = BEATS_DIR / beat
    assert binary.exists(), f"{binary} missing: make setup (setup.d/80-beats.sh)"
    assert Path(JOURNAL_REMOTE).exists(), "systemd-journal-remote missing: make setup (setup.d/80-beats.sh)"
    assert shutil.which("haproxy"), "haproxy missing: make setup"
    return binary


@dataclass
class Entry:
    """One journal entry as a service under systemd would produce it."""

    message: str
    identifier: str
    unit: str
    priority: int = 6
    extra: dict[str, str] = field(default_factory=dict)
    realtime_us: int = 0          # the journal's receive time, set when written


class Journal:
    """Writes successive journal files into one folder, as one boot with a monotonic clock.

    The journal's own timestamps (__REALTIME_TIMESTAMP) are "now", as journald would stamp them, so
    that new entries sort after the ones a reader has already seen.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.boot_id = uuid.uuid4().hex
        self._monotonic_us = 1_000_000
        self._last_realtime_us = 0
        self._files = 0

    def _record(self, e: Entry) -> str:
        assert "\n" not in e.message, "the text form of the export format holds single-line values only"
        realtime = max(int(time.time() * 1e6), self._last_realtime_us + 1)
        self._last_realtime_us = e.realtime_us = realtime
        self._monotonic_us += 1000
        fields = {"__REALTIME_TIMESTAMP": str(realtime), "__MONOTONIC_TIMESTAMP": str(self._monotonic_us),
                  "_BOOT_ID": self.boot_id, "MESSAGE": e.message, "PRIORITY": str(e.priority),
                  "SYSLOG_IDENTIFIER": e.identifier, "_SYSTEMD_UNIT": e.unit, "_TRANSPORT": "stdout",
                  **e.extra}
        return "".join(f"{k}={v}\n" for k, v in fields.items()) + "\n"

    def write(self, entries: list[Entry], append_to: str | None = None) -> Path:
        """A new journal file in the folder holding ``entries`` (or appended to the file ``append_to``).

        Each file takes 8 MB on disk: a stream of small writes (probes) goes into one file.
        """
        self._files += 1
        path = self.folder / (append_to or f"batch-{self._files:03d}.journal")
        export = "".join(self._record(e) for e in entries).encode()
        r = subprocess.run([JOURNAL_REMOTE, "-o", str(path), "-"], input=export, capture_output=True, timeout=60)
        assert r.returncode == 0, f"systemd-journal-remote failed: {r.stderr.decode(errors='replace')}"
        return path


def es_front(workdir: Path, es_url: str) -> tuple[ManagedProcess, str]:
    """HAProxy answering ``GET /`` with the Elasticsearch version and forwarding the rest (test only)."""
    es_host, es_port = es_url.rsplit("//", 1)[1].rsplit(":", 1)
    port = free_port()
    body = '{"name":"opsloop-es","cluster_name":"opsloop","version":{"number":"%s"},"tagline":"You Know, for Search"}' \
        % ES_VERSION
    cfg = workdir / "es-front.cfg"
    workdir.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f"""global
  maxconn 256
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
frontend es_front
  bind 127.0.0.1:{port}
  http-request return status 200 content-type application/json string '{body}' if {{ method GET }} {{ path / }}
  default_backend es
backend es
  server es {es_host}:{es_port}
""")
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        return requests.get(url + "/", timeout=2).json()["version"]["number"] == ES_VERSION

    proc = ManagedProcess(name="es-front", argv=[shutil.which("haproxy") or "haproxy", "-db", "-f", str(cfg)],
                          workdir=workdir, ports={"http": ("127.0.0.1", port)}, ready=ready, ready_timeout_s=30)
    return proc, url


def beat_process(beat: str, config: Path, workdir: Path, es_front_url: str, overrides: list[str]) -> ManagedProcess:
    """``beat`` run with ``config`` as shipped; ``overrides`` are ``-E key=value`` settings (paths only)."""
    binary = require_tools(beat)
    argv = [str(binary), "-c", str(config), "--path.home", str(workdir), "--path.config", str(config.parent),
            "--path.data", str(workdir / "data"), "--path.logs", str(workdir / "logs")]
    for o in overrides:
        argv += ["-E", o]
    return ManagedProcess(name=beat, argv=argv, workdir=workdir, env={"ELASTICSEARCH_HOSTS": es_front_url},
                          stop_timeout_s=30)


def docs_with(es_url: str, marker: str) -> list[dict[str, Any]]:
    """Every shipped document whose message contains ``marker`` (a unique word per test)."""
    requests.post(f"{es_url}/opsloop-logs-*/_refresh", timeout=30)
    r = requests.post(f"{es_url}/opsloop-logs-*/_search", timeout=30, json={
        "size": 1000, "query": {"match_phrase": {"message": marker}}, "sort": [{"@timestamp": "asc"}]})
    if r.status_code == 404:
        return []
    r.raise_for_status()
    return [h["_source"] for h in r.json()["hits"]["hits"]]


def opsloop_line(service: str, level: int, event: str, created: float, **fields: Any) -> str:
    """One line exactly as an opsloop service writes it (opsloop.log's formatter), made at ``created``."""
    record = logging.LogRecord(f"opsloop.{service}", level, __file__, 0, event, None, None)
    record.created, record.msecs = created, (created % 1) * 1000
    record.event, record.fields, record.service = event, fields, service  # type: ignore[attr-defined]
    return JsonFormatter().format(record)


@dataclass
class Batch:
    """Journal entries of one write, and which of them the shipper must (not) deliver."""

    entries: list[Entry]
    expected: dict[str, Entry]        # record id -> entry, for the matched units
    unexpected: set[str]              # record ids of the units the shipper must leave alone


class Scenario:
    """The log lines of one host: opsloop's units (JSON), Horizon's Apache, and cron/sshd noise.

    Every message carries the run's token (to find this test's documents) and a record id
    ``<run>n<seq>`` (to count each record's copies).
    """

    # The application formats the line this long before the journal receives it, so that the
    # document time (the event's) and the journal's receive time differ visibly.
    APP_TO_JOURNAL_S = 42.5

    def __init__(self, run: str) -> None:
        self.run = run
        self._seq = 0
        # The identifiers the shipped systemd units (deploy/systemd) give their lines.
        self.edge_ident = syslog_identifier(UNITS_DIR / "opsloop-edge.service")
        self.collector_ident = syslog_identifier(UNITS_DIR / "opsloop-collector@.service")

    def _id(self) -> str:
        self._seq += 1
        return f"{self.run}n{self._seq:04d}"

    def batch(self, per_kind: int = 2) -> Batch:
        entries: list[Entry] = []
        expected: dict[str, Entry] = {}
        unexpected: set[str] = set()
        for i in range(per_kind):
            rid = self._id()
            level, event = (logging.WARNING, "weights_held") if i % 2 else (logging.INFO, "weights_pushed")
            msg = opsloop_line("edge", level, event, time.time() - self.APP_TO_JOURNAL_S,
                               run=self.run, id=rid, edge="ams1", step=i)
            e = Entry(msg, self.edge_ident, "opsloop-edge.service", priority=6)
            entries.append(e)
            expected[rid] = e
            rid = self._id()
            msg = opsloop_line("collector.ipmi", logging.ERROR, "bmc_timeout", time.time() - self.APP_TO_JOURNAL_S,
                               run=self.run, id=rid, host="stor-g3-17", timeout_s=6.0)
            e = Entry(msg, self.collector_ident, "opsloop-collector@ipmi.service", priority=6)
            entries.append(e)
            expected[rid] = e
            rid = self._id()
            e = Entry(f'10.20.0.5 - - [{time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime())}] '
                      f'"GET /dashboard/project/instances/?run={self.run}&id={rid} HTTP/1.1" 200 5123 "-" "Mozilla/5.0"',
                      "horizon-access", "apache2.service", priority=6)
            entries.append(e)
            expected[rid] = e
            rid = self._id()
            entries.append(Entry(f"(root) CMD (run-parts /etc/cron.hourly {self.run} {rid})", "CRON", "cron.service"))
            unexpected.add(rid)
            rid = self._id()
            entries.append(Entry(f"Accepted publickey for ops from 10.20.0.9 port 50522 ssh2 {self.run} {rid}",
                                 "sshd", "ssh.service", priority=5))
            unexpected.add(rid)
        return Batch(entries, expected, unexpected)

    def bad_line(self) -> Batch:
        """An opsloop line that is not JSON (a crash before logging was set up): shipped, not lost."""
        rid = self._id()
        e = Entry(f"Traceback (most recent call last): boom {self.run} {rid}", self.edge_ident, "opsloop-edge.service",
                  priority=3)
        return Batch([e], {rid: e}, set())

    def probe(self) -> Entry:
        """A matched line whose only purpose is to show the shipper is reading (ids ``<run>p<k>``)."""
        self._seq += 1
        return Entry(opsloop_line("test", logging.INFO, "probe", time.time(), run=self.run,
                                  id=f"{self.run}p{self._seq:04d}"), self.edge_ident, "opsloop-probe.service")

    def ids(self, docs: list[dict[str, Any]]) -> Counter[str]:
        """How many documents carry each record id (probes excluded)."""
        pattern = re.compile(rf"\b{self.run}n\d{{4}}\b")
        return Counter(m for d in docs for m in pattern.findall(str(d.get("message", ""))))


@dataclass
class ShipperRun:
    """What one shipper delivered: the documents of the run and the batches written."""

    beat: str
    scenario: Scenario
    docs: list[dict[str, Any]]
    expected: dict[str, Entry]
    unexpected: set[str]
    before_start: list[str]           # matched lines already in the journal at the first start, in order


def ship_across_a_restart(beat: ManagedProcess, journal: Journal, es_url: str, run: str,
                          timeout_s: float = 180.0) -> ShipperRun:
    """The scenario both shippers go through, event-driven (no sleeps standing in for "it is ready").

    1. Lines already in the journal before the first start: the shipper starts at the tail
       (cursor_seek_fallback) and must never ship them.
    2. Probe lines until one arrives: the shipper is reading (it opened the journal after its start).
    3. A batch (and a non-JSON opsloop line); all matched lines arrive.
    4. The shipper is stopped by PID (SIGTERM), a batch is written while it is down, it is restarted,
       another batch is written; everything matched arrives. Lines arrive in journal order, so once
       the last line of the last batch is in, a duplicate of an earlier line would be in too.
    """
    sc = Scenario(run)
    old = sc.batch(1)
    journal.write(old.entries)
    beat.start()
    try:
        def probe_arrived() -> bool:
            journal.write([sc.probe()], append_to="probes.journal")
            return any(f"{run}p" in str(d.get("message")) for d in docs_with(es_url, run))

        wait_until_(probe_arrived, timeout_s, f"{beat.name} to ship a first line (log {beat.logfile})", beat)
        first, bad = sc.batch(), sc.bad_line()
        journal.write(first.entries + bad.entries)
        expected = {**first.expected, **bad.expected}
        wait_until_(lambda: set(expected) <= set(sc.ids(docs_with(es_url, run))), timeout_s,
                    f"{beat.name} to ship the first batch", beat)
        beat.stop()
        down = sc.batch()
        journal.write(down.entries)
        beat.start()
        after = sc.batch()
        journal.write(after.entries)
        expected |= down.expected | after.expected
        wait_until_(lambda: set(expected) <= set(sc.ids(docs_with(es_url, run))), timeout_s,
                    f"{beat.name} to ship the lines written while it was down and after its restart", beat)
    finally:
        beat.stop()
    unexpected = first.unexpected | down.unexpected | after.unexpected
    return ShipperRun(beat.name, sc, docs_with(es_url, run), expected, unexpected | old.unexpected, list(old.expected))


def wait_until_(fn: Any, timeout_s: float, what: str, proc: ManagedProcess) -> None:
    try:
        wait_until(fn, timeout=timeout_s, interval=1.0, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; last lines of {proc.logfile}:\n{proc.tail(30)}") from None
