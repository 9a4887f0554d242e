"""The agent loop of a detector: batches in, findings out, state in a changelog-backed Faust table.

The runtime's ``batch_agent`` calls a sync handler and stops there; a detector also has to write
its state and send its findings, both async. This loop follows the same pattern (``take_batches``,
``opsloop.streams.runtime.batch.process_batch`` for decoding, dead letters and health metrics) and adds:

0. **One agent for all detectors** (``detectors``), over the union of their topics: a record is
   fetched, decoded and dead-lettered once, and every handler sees the batch.
1. **State table** ``detector-state`` (keys ``<handler>|<state key>``,
   JSON values, memory store rebuilt from its compacted changelog topic on start). After each
   batch the keys the handler touched are written **once** each; a key goes to the changelog
   partition of the source record that last touched it, so the state of a series lives in the
   same partition number as the series and moves with it on a rebalance (Faust assigns table
   partitions together with source partitions).
2. **Restore**: at the first batch after start or after a partition assignment, the handler's
   state is replaced by the table's (already recovered by Faust: consumption of an assigned
   partition resumes only after its table partitions are recovered). A killed worker therefore
   resumes without a second warm-up and without re-opening open findings.
3. **Findings** drained from the handler are sent before the state is written, both before the
   offsets of the batch can be committed by the next commit interval (at-least-once: a crash in
   between replays the batch; a finding's ``first_seen`` is event time, so a replay yields the
   same finding).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Sequence

import faust
from faust.streams import _current_event
from faust.types import TP, EventT

from opsloop.config import Settings
from opsloop.log import get_logger
from opsloop.topics import Topic
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.findings_sink import FindingsSink
from opsloop.streams.runtime import health
from opsloop.streams.runtime.app import raw_topic
from opsloop.streams.runtime.batch import DeadLetter, FanOut, gc_paused, process_batch
from opsloop.streams.runtime.take import consumer_lag, take_batches

log = get_logger("stream.agents")

STATE_TABLE = "detector-state"
AGENT_NAME = "detectors"
KEY_SEP = "|"


def state_table(app: faust.App) -> faust.Table:
    """The one state table of all detector agents (create once per app)."""
    existing = app.tables.get(STATE_TABLE)
    if existing is not None:
        return existing  # type: ignore[return-value]
    return app.Table(STATE_TABLE, default=None, schema=faust.Schema(key_serializer="json", value_serializer="json"),
                     help="Detector state per agent and state key (JSON), for restarts and rebalances")


def findings_sink(app: faust.App) -> FindingsSink:
    topic = raw_topic(app, Topic.FINDINGS)

    async def send(key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> object:
        return await topic.send(key=key, value=value, headers=headers)

    return FindingsSink(send)


@contextlib.contextmanager
def _as_current(event: EventT) -> Iterator[None]:
    """Make ``event`` Faust's current event, so a table write goes to its partition."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)


class StatefulAgent:
    """Runs ``DetectorHandler``s as one Faust agent over the union of their topics (module docstring).

    One agent, not one per handler: a record is fetched, decoded and (if bad) dead-lettered once,
    however many detectors read its topic (the anomaly detector shares topics with the others).
    """

    def __init__(self, app: faust.App, handlers: Sequence[DetectorHandler], settings: Settings, table: faust.Table,
                 sink: FindingsSink, name: str = AGENT_NAME) -> None:
        self.app = app
        self.handlers = list(handlers)
        self.name = name
        self.table = table
        self.sink = sink
        self.size = settings.stream.batch_size
        self.within = settings.stream.batch_within_s
        self.backlog_within = settings.stream.batch_backlog_within_s
        self.max_clock_skew_s = settings.stream.max_clock_skew_s
        self.needs_restore = True
        self.deadletter = raw_topic(app, Topic.DEADLETTER)
        self._all = FanOut(name, self.handlers)

    @property
    def topics(self) -> list[str]:
        return sorted({str(t) for h in self.handlers for t in h.topics})

    def register(self) -> None:
        # raw_topic: kafka.topic_prefix applied like every other topic of the deployment, and
        # internal=True (Faust creates the source topics at subscription with the app's partition
        # count, the same as the state table's, instead of waiting minutes for a metadata refresh).
        source = raw_topic(self.app, *self.topics)

        async def agent(stream: faust.StreamT) -> None:
            async for events in take_batches(stream, self.size, self.within, self.backlog_within,
                                             consumer_lag(self.app)):
                try:
                    await self.run_batch(events)
                except Exception as e:  # noqa: BLE001 - a bug here must not stop the agent for good
                    health.ERRORS.labels(self.name).inc()
                    log.error("detector_batch_failed", agent=self.name, error=f"{type(e).__name__}: {e}",
                              exc_info=True)

        async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
            self.needs_restore = True

        self.app.on_partitions_assigned.connect(on_assigned, weak=False)
        self.app.agent(source, name=self.name)(agent)

    async def _send_deadletter(self, dl: DeadLetter) -> None:
        await self.deadletter.send(key=dl.key, value=dl.encode())

    def _highwater(self, topic: str, partition: int) -> int | None:
        try:
            return self.app.consumer.highwater(TP(topic, partition))
        except Exception:  # noqa: BLE001 - not assigned yet / no fetch yet
            return None

    def restore(self) -> None:
        by_handler: dict[str, dict[str, Any]] = {h.name: {} for h in self.handlers}
        for k, v in self.table.items():
            if not isinstance(k, str) or not isinstance(v, dict) or KEY_SEP not in k:
                continue
            handler, key = k.split(KEY_SEP, 1)
            if handler in by_handler:
                by_handler[handler][key] = v
        for h in self.handlers:
            h.restore(by_handler[h.name])
            h.touched()          # restoring is not a change to write back
            h.drain_outbox()
            self.sink.restore(h.open_findings())
            log.info("state_restored", agent=h.name, keys=len(by_handler[h.name]),
                     open_findings=len(h.open_findings()))
        self.needs_restore = False

    async def run_batch(self, events: Sequence[EventT]) -> None:
        if self.needs_restore:
            self.restore()
        # One handler call per source partition number, so every touched key is known to come from
        # that partition (its table entry must live in the same partition number). The topics of a
        # partition number share one call: a handler's fixed cost per call (gauges, sweeps, books)
        # is then paid once per partition, not once per topic and partition.
        groups: dict[int, list[EventT]] = {}
        for e in events:
            groups.setdefault(e.message.partition, []).append(e)
        owner: dict[tuple[DetectorHandler, str], EventT] = {}
        for group in groups.values():
            await process_batch(self.name, [e.message for e in group], self._all, self._send_deadletter,
                                self._highwater, max_clock_skew_s=self.max_clock_skew_s)
            for h in self.handlers:
                for key in h.touched():
                    owner[(h, key)] = group[-1]
        for h in self.handlers:
            await self.sink.publish(h.drain_outbox())
        with gc_paused():   # synchronous: a state dict per touched key, all alive until written
            for (h, key), event in owner.items():
                self.write_state(h, key, event)

    def write_state(self, handler: DetectorHandler, key: str, event: EventT) -> None:
        try:
            state = handler.state_of(key)
        except Exception as e:  # noqa: BLE001 - one bad key must not lose the others
            log.error("state_serialise_failed", agent=handler.name, key=key, error=f"{type(e).__name__}: {e}")
            return
        table_key = handler.name + KEY_SEP + key
        with _as_current(event):
            if state is None:
                if table_key in self.table:
                    del self.table[table_key]
            else:
                self.table[table_key] = state


def detector_agent(app: faust.App, handlers: Sequence[DetectorHandler], settings: Settings, table: faust.Table,
                   sink: FindingsSink) -> StatefulAgent:
    agent = StatefulAgent(app, handlers, settings, table, sink)
    agent.register()
    return agent
