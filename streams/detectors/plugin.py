"""What a detector folder registers: its config key, its settings model and its stream handler.

Each folder under ``streams/detectors/`` (``power/``, ``firewall/``, ...) holds the pure logic
(``detector.py``), the stream handler (``handler.py``) and the settings model (``settings.py``), and
declares one :class:`Detector` in its ``__init__.py``; ``registry.py`` lists them, one line each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict

from opsloop.validation import NoBoolNumbers

if TYPE_CHECKING:
    from opsloop.streams.agents.base import DetectorHandler


class Strict(NoBoolNumbers):
    """Base of every detector's settings: an unknown key is an error, not silently ignored; a boolean where a
    number is meant too (`baseline_runs: yes` was one run, `eur_per_kwh: on` 1 EUR)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _enabled(settings: Any) -> bool:
    return bool(settings.enabled)


@dataclass(frozen=True, slots=True)
class Detector:
    """One detector: ``streams.detectors.<name>`` of opsloop.yaml is validated by ``settings``;
    ``handler(settings, refresh_s)`` builds the stream handler when ``active(settings)``."""

    name: str
    settings: type[BaseModel]
    handler: Callable[[Any, float], DetectorHandler]
    active: Callable[[Any], bool] = _enabled
