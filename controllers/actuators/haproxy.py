"""HAProxy target: integer weights through the runtime API (``get weight`` / ``set weight``).

A batch is written server by server (the runtime API has no transaction); if one ``set weight``
fails, the servers already changed are put back to the weights read before, so a failed apply
leaves the backend as it was. Note ``balance static-rr`` backends refuse runtime weights other than
0%/100%: HAProxy's reply is raised as a command error.
"""

from __future__ import annotations

from opsloop.lb.haproxy import HaproxyAPI, HaproxyError, StatParseError, parse_show_stat

from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import HaproxyTargetConfig
from opsloop.controllers.actuators.mapping import HAPROXY_MAX_WEIGHT


def _kind(error: HaproxyError) -> str:
    text = str(error)
    return "unreachable" if ("admin socket" in text or "does not exist" in text) else "command"


class HaproxyTarget:
    kind = "haproxy"
    max_weight = HAPROXY_MAX_WEIGHT

    def __init__(self, config: HaproxyTargetConfig, api: HaproxyAPI | None = None) -> None:
        self.config = config
        self.api = api or HaproxyAPI(config.socket, timeout_s=config.timeout_s)

    @property
    def origins(self) -> list[str]:
        return list(self.config.servers)

    def describe(self) -> str:
        return f"haproxy:{self.config.edge}/{self.config.listener}"

    def read(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for origin, server in self.config.servers.items():
            try:
                out[origin] = self.api.get_weight(self.config.backend, server)[0]
            except HaproxyError as e:
                raise ActuatorError(f"{self.describe()}: {e}", _kind(e)) from None
        return out

    def write(self, weights: dict[str, int]) -> None:
        unknown = sorted(set(weights) - set(self.config.servers))
        if unknown:
            raise ActuatorError(f"{self.describe()}: no server configured for origin(s) {unknown}", "config")
        before = self.read()
        done: list[str] = []
        for origin, weight in weights.items():
            try:
                self.api.set_weight(self.config.backend, self.config.servers[origin], weight)
            except HaproxyError as e:
                self._undo(done, before)
                raise ActuatorError(f"{self.describe()}: {e} (undone: {done or 'nothing'})", _kind(e)) from None
            done.append(origin)

    def _undo(self, done: list[str], before: dict[str, int]) -> None:
        for origin in done:
            try:
                self.api.set_weight(self.config.backend, self.config.servers[origin], before[origin])
            except HaproxyError:
                pass  # the read-back after the failed apply reports what is live

    def down(self) -> set[str]:
        """Origins whose server HAProxy reports DOWN or in maintenance (health checks)."""
        try:
            rows = parse_show_stat(self.api.show_stat())
        except (HaproxyError, StatParseError):
            return set()
        status = {r.get("svname"): r.get("status", "") for r in rows if r.get("pxname") == self.config.backend}
        return {o for o, srv in self.config.servers.items()
                if status.get(srv, "").upper().startswith(("DOWN", "MAINT"))}
