"""Stream detectors: one folder per detector (logic, stream handler, settings), listed in ``registry``.

``firewall``, ``keystone``, ``netperf``, ``power`` (domain rules producing ``opsloop.records.Finding``),
``anomaly`` (any numeric series); ``findingbook`` (the finding lifecycle), ``sketches``; ``replay_cli``
(``opsloop detect replay``) and ``evaluate_cli`` (``opsloop detect evaluate``) over ``labelled_csv`` (the
benchmarks' file layouts) and ``series_text`` (timestamp/value parsers), ``scenarios`` and ``evaluation``
(the labeled scenario set and its precision/recall/delay report). See README.md, "Adding a detector".
"""
