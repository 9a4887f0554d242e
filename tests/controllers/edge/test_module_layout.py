"""The control law is split into modules of one concern (base, safety, demand, holddown, baselines);
the names code outside the package imported from ``controller`` before the split stay importable
there, as the same objects (a second copy would be a second class, and isinstance would fail)."""

from __future__ import annotations

import opsloop.controllers.edge.controller as controller
from opsloop.controllers.edge import base, baselines, demand, holddown, safety


def test_the_controllers_public_names_are_importable_from_controller_as_the_same_objects():
    homes = {"Controller": base, "Decision": base, "Observation": base, "Proposal": base,
             "FixedStepController": baselines, "UndampedController": baselines,
             "HoldDown": holddown, "big_moves": demand, "enforce_safety": safety,
             "strip_unusable": safety, "usable_mask": safety}
    assert set(controller.__all__) == set(homes) | {"EdgeController"}
    for name, module in homes.items():
        assert getattr(controller, name) is getattr(module, name), name
