"""Faust's Kafka transport with the worker consumer's fetch wait taken from our settings.

faust-streaming 0.15 creates the worker's aiokafka consumer with ``fetch_max_wait_ms=1500``, fixed.
aiokafka keeps one fetch request in flight per broker and only fetches partitions whose records it
has handed out, so as soon as one assigned partition is at its end, the broker holds that request
for up to 1.5 s and the partitions that still have records wait behind it. A backlog is then read in
bursts with ~1 s pauses: the worker idled half the time in ``make bench`` (stream stage). A short
wait costs one empty fetch per ``fetch_max_wait_ms`` per broker on an idle topic, nothing more.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver

from opsloop.streams.runtime.delivery import DrainConsumer


def kafka_transport(app: faust.App, fetch_max_wait_ms: int) -> driver.Transport:
    """The app's consumer transport (set it as ``app.transport`` before the app starts)."""

    class ConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # aiokafka hands this to its Fetcher in start(); there is no public setter.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class WorkerConsumer(DrainConsumer):   # and a record delivered without four tasks (delivery.py)
        def _new_consumer_thread(self) -> ConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class Transport(driver.Transport):
        Consumer = WorkerConsumer

    return Transport(app.conf.broker_consumer, app)
