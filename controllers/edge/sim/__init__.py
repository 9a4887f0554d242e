"""Closed-loop simulator of the edge-weight loop (``opsloop sim``): a plant with latency-elastic
clients, every controller of a scenario run on the same plant, events and noise, and the verdict.

| module | what |
|---|---|
| :mod:`.scenario` | the scenario file: schema, validation, controller kinds |
| :mod:`.plant` | clients, network and origins stepped every ``dt_s``; one controller's :class:`Run` |
| :mod:`.metrics` | figures per phase and over the whole run; trajectories for ``--json`` |
| :mod:`.verdict` | the targets and the comparison with both fixed-step baselines; :func:`run_scenario` |
"""

from opsloop.controllers.edge.sim.metrics import phase_bounds, phase_metrics, run_metrics, trajectories
from opsloop.controllers.edge.sim.plant import Plant, Run, make_controller, simulate
from opsloop.controllers.edge.sim.scenario import (BASELINES, CONTROLLER_KINDS, KIND_ALIASES, Event,
                                                   Scenario, ScenarioError, SimEdge, SimOrigin, Targets,
                                                   canonical_kind, load_scenario)
from opsloop.controllers.edge.sim.verdict import (compare_with_baselines, run_scenario, summarize,
                                                  violations)

__all__ = ["BASELINES", "CONTROLLER_KINDS", "KIND_ALIASES", "Event", "Plant", "Run", "Scenario",
           "ScenarioError", "SimEdge", "SimOrigin", "Targets", "canonical_kind", "compare_with_baselines",
           "load_scenario", "make_controller", "phase_bounds", "phase_metrics", "run_metrics",
           "run_scenario", "simulate", "summarize", "trajectories", "violations"]
