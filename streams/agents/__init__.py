"""The agent runtime the detectors run in (the detectors themselves: ``opsloop.streams.detectors``).

``base`` (the handler interface), ``findings_sink`` (findings to Kafka and Prometheus), ``stateful``
(the agent loop with state in a changelog-backed table), ``settings`` (``streams.detectors`` of
opsloop.yaml) and ``register`` (``register_detector_agents``: the registered detectors into an app).
"""
