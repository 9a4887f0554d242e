"""Stream agents that turn telemetry into findings: one module per signal family.

``firewall``, ``keystone``, ``netperf``, ``power`` (domain detectors), ``anomaly`` (the generic
streaming detector on configured series), ``findings_sink`` (findings to Kafka and Prometheus),
``stateful`` (the agent loop with state in a changelog-backed table) and ``settings``
(``controllers.detectors`` of opsloop.yaml). ``register_detector_agents`` wires them into an app.
"""

from __future__ import annotations

import faust

from opsloop.config import Settings
from opsloop.streams.agents.base import DetectorHandler
from opsloop.streams.agents.settings import DetectorsSettings, detectors_settings


def detector_handlers(conf: DetectorsSettings) -> list[DetectorHandler]:
    """The enabled handlers, fresh (no Kafka needed: what unit tests and benchmarks use)."""
    from opsloop.streams.agents.anomaly import AnomalyHandler
    from opsloop.streams.agents.firewall import FirewallHandler
    from opsloop.streams.agents.keystone import KeystoneHandler
    from opsloop.streams.agents.netperf import NetperfHandler
    from opsloop.streams.agents.power import PowerHandler

    r = conf.refresh_s
    out: list[DetectorHandler] = []
    if conf.firewall.enabled:
        out.append(FirewallHandler(conf.firewall, r))
    if conf.keystone.enabled:
        out.append(KeystoneHandler(conf.keystone, r))
    if conf.netperf.enabled:
        out.append(NetperfHandler(conf.netperf, r))
    if conf.power.enabled:
        out.append(PowerHandler(conf.power, r))
    if conf.anomaly.enabled and conf.anomaly.series:
        out.append(AnomalyHandler(conf.anomaly, r))
    return out


def register_detector_agents(app: faust.App, settings: Settings) -> list[DetectorHandler]:
    """Register the ``detectors`` agent running every enabled detector (state table, findings sink)."""
    from opsloop.streams.agents.stateful import detector_agent, findings_sink, state_table

    handlers = detector_handlers(detectors_settings(settings))
    for h in handlers:
        h.bound_state(max_clock_skew_s=settings.stream.max_clock_skew_s, state_ttl_s=settings.stream.state_ttl_s,
                      max_state_keys=settings.stream.max_state_keys)
    if handlers:
        detector_agent(app, handlers, settings, state_table(app), findings_sink(app))
    return handlers
