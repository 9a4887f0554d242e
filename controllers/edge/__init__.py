"""Edge weights ("Building A Smarter AWS Global Accelerator"): the model, the LP scheduler, the controllers and a closed-loop simulator.

- :mod:`opsloop.controllers.edge.model`      listeners, edges, origins, latency, demand; ``EdgeWeights`` records
- :mod:`opsloop.controllers.edge.scheduler`  ``solve(...)`` (HiGHS LP) and the ``greedy(...)`` baseline
- :mod:`opsloop.controllers.edge.controller` our control law, the fixed-step (2 %) baseline, the safety guard
- :mod:`opsloop.controllers.edge.findings`   findings for shedding and fail-static holds
- :mod:`opsloop.controllers.edge.sim`        the plant with latency-elastic clients; metrics
- :mod:`opsloop.controllers.edge.sim_cli`    ``opsloop sim --scenario FILE [--json] [--plot PNG]``
"""
