"""Edge weights ("Building A Smarter AWS Global Accelerator"): the model, the LP scheduler, the controllers and a closed-loop simulator.

- :mod:`opsloop.controllers.edge.model`      listeners, edges, origins, latency, demand; ``EdgeWeights`` records
- :mod:`opsloop.controllers.edge.scheduler`  ``solve(...)`` (HiGHS LP) and the ``greedy(...)`` baseline
- :mod:`opsloop.controllers.edge.base`       ``Observation``, ``Decision``, the ``Controller`` base (fail static, guard, versions)
- :mod:`opsloop.controllers.edge.safety`     the final guard on every controller's weights
- :mod:`opsloop.controllers.edge.controller` our control law (``EdgeController``)
- :mod:`opsloop.controllers.edge.demand`     its demand model: estimate, ramps, steps, variability, elasticity
- :mod:`opsloop.controllers.edge.response`   what the origins' response times say (slowed, unloaded, at other loads)
- :mod:`opsloop.controllers.edge.holddown`   hold-down and ramp-in of returning origins
- :mod:`opsloop.controllers.edge.baselines`  the fixed-step (2 %) and undamped baselines
- :mod:`opsloop.controllers.edge.findings`   findings for shedding and fail-static holds
- :mod:`opsloop.controllers.edge.sim`        the plant with latency-elastic clients; metrics
- :mod:`opsloop.controllers.edge.sim_cli`    ``opsloop sim --scenario FILE [--json] [--plot PNG]``
"""
