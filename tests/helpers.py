"""Shared test helpers: waiting for a condition, querying Prometheus, reading topics, running workers."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Coroutine, Iterator, TypeVar

import orjson
import requests
import yaml
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from opsloop.records import Finding
from opsloop.stack import ManagedProcess, free_port

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent


@dataclass
class ConsumerMsg:
    """A consumer record as a batch hands it to the runtime (what ``decode_messages`` reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class SimTime:
    """A stand-in for the ``time`` module a stage reads (``monkeypatch.setattr(module, "time", clock)``):
    ``time()`` is the simulated wall clock ``now``; ``perf_counter()`` stays real (durations only)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    @staticmethod
    def perf_counter() -> float:
        return time.perf_counter()


class _IdleJumpSelector:
    """The loop's selector, except that a wait for the next timer takes no wall time: the loop's clock jumps
    to the timer instead (ready I/O is still taken first; with no timer at all it blocks as before)."""

    def __init__(self, real: Any, loop: "VirtualClockLoop") -> None:
        self._real, self._loop = real, loop

    def select(self, timeout: float | None = None) -> Any:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            return self._real.select(None)
        self._loop.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` moves only while every task waits for a timer, straight to that timer.
    Deadlines read off the loop (``loop.time()``, ``asyncio.timeout``, ``wait_for``, ``asyncio.wait``) then
    depend on what the code awaits, never on how long the machine took to run it: a loaded machine's
    scheduling delay can no longer make a deadline pass between two steps. For code whose I/O is in memory
    (fakes): a thread's work or a socket's answer is not waited for before the clock jumps."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _IdleJumpSelector(self._selector, self)  # type: ignore[has-type]

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


def run_on_virtual_clock(coro: Coroutine[Any, Any, T], limit_s: float = 20.0) -> T:
    """Run ``coro`` on a :class:`VirtualClockLoop`, failing (not hanging) if it waits longer than ``limit_s``
    of that clock (a deadline for a hang; a task that never waits is left to pytest's timeout)."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(asyncio.wait_for(coro, limit_s))


def wait_until(fn: Callable[[], T], timeout: float = 60.0, interval: float = 0.5, what: str = "condition") -> T:
    """Poll ``fn`` until it returns a truthy value (a deadline for waiting, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def prom_query(base_url: str, query: str) -> list[dict[str, Any]]:
    r = requests.get(f"{base_url}/api/v1/query", params={"query": query}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[Any]:
    """Every record currently in ``topic`` (all partitions, from the beginning)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500,
                             group_id=None)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.position(tp) < end[tp] for tp in tps):
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend(recs)
        return out
    finally:
        consumer.close()


def findings_read(records: Any) -> Iterator[tuple[Any, Finding]]:
    """(record, finding) of each record of the findings topic that is a finding; the others skipped: the topic is
    shared by the session's tests, some of which put on it records a finding's decoder refuses, on purpose."""
    for r in records:
        try:
            yield r, Finding.decode(r.value)
        except ValueError:   # RecordError (a WireError), orjson's
            continue


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def opsloop_process(name: str, args: list[str], workdir: Path, ready: Callable[[], bool] | None = None,
                    ports: dict[str, tuple[str, int]] | None = None) -> ManagedProcess:
    """An `opsloop ...` subcommand as a managed process (own process group, stopped by PID)."""
    return ManagedProcess(name=name, argv=[sys.executable, "-m", "opsloop.cli", *args], workdir=workdir,
                          env={"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
                          ready=ready, ready_timeout_s=90, ports=ports or {})


def metrics_up(port: int) -> bool:
    return requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).ok


def create_topics(bootstrap: str, *names: str, partitions: int = 1, max_message_bytes: int | None = None) -> None:
    """New topics; ``max_message_bytes``: their ``max.message.bytes`` (the broker refuses a larger record for good)."""
    configs = {} if max_message_bytes is None else {"max.message.bytes": str(max_message_bytes)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, partitions, 1, topic_configs=configs) for n in names])
    finally:
        admin.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def metric_samples(port: int) -> list[Sample]:
    """Every sample of a /metrics endpoint (one request; pick with :func:`samples_named`)."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def samples_named(samples: list[Sample], name: str,
                  labels: dict[str, str] | None = None) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample ``name`` among ``samples`` matching ``labels``."""
    return [(s.labels, s.value) for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items())]


def metric_value(samples: list[Sample], name: str, labels: dict[str, str] | None = None) -> float | None:
    """The sum over the series ``name`` matching ``labels`` among ``samples`` (None: no such series)."""
    found = samples_named(samples, name, labels)
    return sum(v for _, v in found) if found else None


def scrape_metric(port: int, name: str, labels: dict[str, str] | None = None) -> float | None:
    """Read one sample from a /metrics endpoint (sum over series matching ``labels``)."""
    return metric_value(metric_samples(port), name, labels)


def run_cli(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "opsloop.cli", *args], capture_output=True, text=True,
                          input=input, timeout=timeout, cwd=REPO)


__all__ = ["create_topics", "free_port", "metrics_up", "opsloop_process", "prom_query", "read_topic", "run_cli", "scrape_metric",
           "metric_samples", "metric_value", "samples_named", "unique", "wait_until", "write_config"]


@contextmanager
def serve_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """An in-process HTTP server on a free loopback port running ``handler``; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class LogLines(logging.Handler):
    """The ``opsloop`` loggers' warnings and errors as ``"<event> <fields>"`` lines (see :func:`captured_logs`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{getattr(record, 'event', '')} {getattr(record, 'fields', '')}")


@contextmanager
def captured_logs() -> Iterator[LogLines]:
    """Collect what the ``opsloop`` loggers warn about while the block runs (no pytest fixture needed: usable
    inside hypothesis examples)."""
    logs, logger = LogLines(), logging.getLogger("opsloop")
    logger.addHandler(logs)
    try:
        yield logs
    finally:
        logger.removeHandler(logs)


def write_case_file(path: Path, content: str | bytes | None) -> Path:
    """A bad-file test case at ``path``: ``"dir"`` a directory, bytes as they are, text as UTF-8,
    ``None`` nothing (a missing file)."""
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    return path


class SentRecords:
    """A producer that keeps what is sent to it, as ``(topic, key, value)``: the services' ``send`` and ``flush``."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> None:
        self.records.append((topic, key, value))

    def flush(self, timeout: float | None = None) -> None:
        pass

    def deadletters(self, topic: str = "telemetry.deadletter") -> list[dict[str, Any]]:
        return [orjson.loads(v or b"") for t, _, v in self.records if t == topic]


class CountingProducer:
    """A producer (real or a stand-in) counting its sends to one topic; everything else passes through."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer, self.topic, self.sends = producer, topic, 0

    def send(self, topic: str, **kwargs: Any) -> Any:
        self.sends += topic == self.topic
        return self.producer.send(topic, **kwargs)

    def flush(self, timeout: float | None = None) -> None:
        self.producer.flush(timeout=timeout)

    def close(self) -> None:
        self.producer.close()


class KeptLines(logging.Handler):
    """The messages of the log records a logger hands it (e.g. kafka-python's own, under ``kafka.*``)."""

    def __init__(self, level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def topic_partitions(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (0: none known)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return len(consumer.partitions_for_topic(topic) or ())
    finally:
        consumer.close()
