"""Wire the registered detectors into a Faust app: one ``detectors`` agent, its state table and findings sink."""

from __future__ import annotations

import faust

from opsloop.config import Settings
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.settings import detectors_settings
from opsloop.streams.agents.stateful import detector_agent, findings_sink, state_table
from opsloop.streams.detectors.registry import detector_handlers


def register_detector_agents(app: faust.App, settings: Settings) -> list[DetectorHandler]:
    """Register the ``detectors`` agent running every enabled detector (state table, findings sink)."""
    handlers = detector_handlers(detectors_settings(settings))
    for h in handlers:
        h.bound_state(max_clock_skew_s=settings.stream.max_clock_skew_s, state_ttl_s=settings.stream.state_ttl_s,
                      max_state_keys=settings.stream.max_state_keys)
    if handlers:
        detector_agent(app, handlers, settings, state_table(app), findings_sink(app))
    return handlers
