"""A stream worker whose one agent stops for good once ``--block-file`` exists (for tests/streams/test_partition_progress.py).

The project's runtime as `opsloop stream worker` runs it (create_app: transport, watchdog, membership guard, partition
progress; batch_agent; /metrics), over one topic, with a do-nothing handler and an after-batch hook that, once the
file exists, awaits forever: the batch in hand is never acked, nothing of its partition is committed again, the
worker still holds the partition and its event loop runs. A sink that hangs looks the same.

    python -m tests.streams.stuck_worker --config opsloop.yaml --topic T --block-file F
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Sequence

import faust

from opsloop.config import load_settings
from opsloop.log import get_logger, setup_logging
from opsloop.metrics import serve_metrics
from opsloop.records import Metric
from opsloop.streams.runtime.app import batch_agent, create_app

log = get_logger("stream.stuck_worker")
AGENT = "stuck"


class Noop:
    name = "noop"

    def handle(self, metrics: Sequence[Metric], now: float) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stuck_worker")
    p.add_argument("--config", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--block-file", required=True, type=Path)
    args = p.parse_args(argv)
    settings = load_settings(args.config)
    setup_logging("opsloop-stuck-worker", "info")
    serve_metrics(settings.stream.metrics_port, settings.stream.metrics_bind)
    app = create_app(settings)
    block: Path = args.block_file

    async def hang_once_blocked() -> None:
        if block.exists():
            log.warning("agent_blocked", agent=AGENT, reason=f"{block} exists")
            await asyncio.Event().wait()

    batch_agent(app, AGENT, [args.topic], [Noop()], settings,  # type: ignore[list-item]
                after_batch=[hang_once_blocked])
    faust.Worker(app, loglevel="info", redirect_stdouts=False, quiet=True).execute_from_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
