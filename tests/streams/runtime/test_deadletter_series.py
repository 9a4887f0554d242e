"""OpsloopDeadLetterGrowing takes increase() of opsloop_stream_deadlettered_total by topic: a series born at its
first dead letter (1, then 1, ...) shows no increase, so a first bad record on a topic that never had one was not
alerted. Each agent's source topics (and the handlers' label) have the series at 0 once the worker's app exists."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.streams.worker import build_app
from tests.helpers import unique


def test_every_source_topics_dead_letter_series_exists_at_0_from_the_start(tmp_path: Path) -> None:
    prefix = f"{unique('dlseries')}."
    build_app(Settings.model_validate({"kafka": {"topic_prefix": prefix},
                                       "stream": {"data_dir": str(tmp_path / "streams")}}))
    for topic in ("telemetry.lb", "telemetry.ipmi", "telemetry.iptables", "telemetry.keystone", "telemetry.netperf"):
        assert REGISTRY.get_sample_value("opsloop_stream_deadlettered_total", {"topic": prefix + topic}) == 0.0, topic
    assert REGISTRY.get_sample_value("opsloop_stream_deadlettered_total", {"topic": "handler"}) is not None
