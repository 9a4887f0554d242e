"""`opsloop stream worker` whose detectors agent does not wait for its state writes' acknowledgements: the
baseline of ``bench/bench_state_confirm.py`` (the behaviour before the wait: writes sent, never awaited).

    python -m bench.confirm_off --config opsloop.yaml
"""

from __future__ import annotations

import sys
from typing import Sequence

from faust.types import EventT

from opsloop.streams.agents.stateful import StatefulAgent
from opsloop.streams.worker import main


async def confirm_nothing(self: StatefulAgent, batch: Sequence[EventT]) -> None:
    self._writes, self._deletes = {}, []


if __name__ == "__main__":
    StatefulAgent.confirm_writes = confirm_nothing  # type: ignore[method-assign]
    sys.exit(main())
