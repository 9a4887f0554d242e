"""Edge weights (seed 003): the model, the LP scheduler, the controllers and a closed-loop simulator.

- :mod:`controllers.edge.model`      listeners, edges, origins, latency, demand; ``EdgeWeights`` records
- :mod:`controllers.edge.scheduler`  ``solve(...)`` (HiGHS LP) and the ``greedy(...)`` baseline
- :mod:`controllers.edge.controller` our control law, the seed's 2 % damping, the safety guard
- :mod:`controllers.edge.findings`   findings for shedding and fail-static holds
- :mod:`controllers.edge.sim`        the plant with latency-elastic clients; metrics
- :mod:`controllers.edge.sim_cli`    ``opsloop sim --scenario FILE [--json] [--plot PNG]``
"""
