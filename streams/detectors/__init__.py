"""Stream detectors: pure, incremental, state-serialisable logic that the Faust agents call.

``anomaly`` (any numeric series), ``firewall``, ``keystone``, ``netperf``, ``power`` (domain rules
producing ``opsloop.findings.Finding``), ``replay_cli`` (``opsloop detect replay``), ``scenarios`` and
``evaluation`` (the labeled scenario set and its precision/recall/delay report).
"""
