"""OpsloopTelemetrySilent (alerts/rules/pipeline.yml) fires on a topic whose opsloop_stream_samples_total has not
grown for 10 min after it grew within the hour: the age gauge OpsloopStaleData reads keeps its last value when no
sample comes, and a Telegraf-fed topic has no collector metrics of ours. The rule needs the topic's series while
nothing comes: a restarted worker had none until its first sample, and the silence of a topic that stopped before
the restart ended the alert (promtool: alerts/tests/pipeline_test.yml). Each source topic's series exists at 0
once the worker's app exists."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from opsloop.config import Settings
from opsloop.streams.worker import build_app
from tests.helpers import unique

SOURCE_TOPICS = ("telemetry.lb", "telemetry.ipmi", "telemetry.iptables", "telemetry.keystone", "telemetry.netperf")


def test_every_source_topics_samples_series_exists_at_0_from_the_start(tmp_path: Path) -> None:
    prefix = f"{unique('silent')}."
    build_app(Settings.model_validate({"kafka": {"topic_prefix": prefix},
                                       "stream": {"data_dir": str(tmp_path / "streams")}}))
    for topic in SOURCE_TOPICS:
        assert REGISTRY.get_sample_value("opsloop_stream_samples_total", {"topic": prefix + topic}) == 0.0, topic
