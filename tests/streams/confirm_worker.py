"""`opsloop stream worker` with a shorter STATE_CONFIRM_S (for tests/streams/test_state_confirm_outage.py).

The real worker (``opsloop.streams.worker.main``: every agent, the runtime's watchdog, membership guard, progress,
/metrics), except that

- the detectors agent says its batch waits for its state writes' acknowledgements after ``--confirm-s`` instead of
  60 s, so a test's outage can outlast it in seconds;
- while ``--gate`` exists, a batch of the detectors agent is held before it is handled (``--gate`` with ``.held``
  appended is written then): a test stops the broker with the batch's records fetched and its state not yet written,
  and removes the gate to let the batch write its state into the outage.

    python -m tests.streams.confirm_worker --confirm-s 3 --gate /tmp/gate --config opsloop.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any, Sequence

from opsloop.streams.agents import stateful
from opsloop.streams.worker import main

GATE_POLL_S = 0.1


def hold_at(gate: Path) -> None:
    """Hold each batch of the detectors agent before it is handled while ``gate`` exists."""
    handle = stateful.StatefulAgent.run_batch

    async def gated(self: stateful.StatefulAgent, events: Sequence[Any]) -> None:
        if gate.exists():
            gate.with_name(gate.name + ".held").write_text(str(len(events)))
            while gate.exists():
                await asyncio.sleep(GATE_POLL_S)
        await handle(self, events)

    stateful.StatefulAgent.run_batch = gated  # type: ignore[method-assign]


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="confirm_worker")
    p.add_argument("--confirm-s", type=float, required=True)
    p.add_argument("--gate", type=Path, required=True)
    args, rest = p.parse_known_args(argv)
    stateful.STATE_CONFIRM_S = args.confirm_s
    hold_at(args.gate)
    return main(rest)


if __name__ == "__main__":
    sys.exit(run())
