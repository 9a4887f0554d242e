"""A task on the worker's event loop every ``interval_s`` from the app's start (``app.add_dependency``): Faust's
``app.timer`` starts only after the first recovery, the one a watchdog must see hang."""

from __future__ import annotations

from typing import Any

import mode


class PeriodicService(mode.Service):
    """Sleeps ``interval_s``, then awaits :meth:`once`, until the service stops. ``once`` handles its own errors:
    what one look raises is the subclass's to log (the loop itself never ends on it)."""

    def __init__(self, interval_s: float, **kwargs: Any) -> None:
        self.interval_s = interval_s
        super().__init__(**kwargs)

    async def once(self) -> None:
        raise NotImplementedError

    @mode.Service.task
    async def _every(self) -> None:
        while not self.should_stop:
            await self.sleep(self.interval_s)
            await self.once()
