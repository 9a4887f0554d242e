"""`opsloop stack up|down|status`: the local real stack for `make run`, the tests and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from opsloop.config import StackSettings
from opsloop.stack import components
from opsloop.stack.process import ManagedProcess, StackError


# Components that re-read their config file on SIGHUP. One already running (`opsloop stack up` before
# `opsloop run`) is reloaded with the config `up` just wrote: it kept its own, and Alertmanager's null
# receiver dropped every page `opsloop run` routes to the lab pager, with no word of it.
RELOAD_ON_SIGHUP = frozenset({"alertmanager", "prometheus"})


@dataclass
class Stack:
    settings: StackSettings
    alertmanager_config: Path | None = None
    rule_files: list[Path] | None = None
    with_alertmanager: bool = True
    with_prometheus: bool = True

    @property
    def bind(self) -> str:
        return self.settings.bind

    @property
    def kafka_bootstrap(self) -> str:
        return f"{self.bind}:{self.settings.kafka_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.bind}:{self.settings.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{self.bind}:{self.settings.alertmanager_port}"

    def components(self) -> list[ManagedProcess]:
        s = self.settings
        data = Path(s.data_dir)
        out = [components.kafka(data, s.bind, s.kafka_port, s.kafka_controller_port, s.kafka_heap)]
        if self.with_alertmanager:
            out.append(components.alertmanager(data, s.bind, s.alertmanager_port, self.alertmanager_config))
        if self.with_prometheus:
            am = f"{s.bind}:{s.alertmanager_port}" if self.with_alertmanager else None
            out.append(components.prometheus(data, s.bind, s.prometheus_port, s.scrape_targets,
                                             s.scrape_interval_s, am, self.rule_files))
        return out

    def add_scrape_target(self, name: str, address: str, labels: dict[str, str] | None = None) -> None:
        """Have Prometheus scrape ``address`` (host:port) from now on (file-based service discovery)."""
        import orjson

        targets = Path(self.settings.data_dir) / "prometheus" / "targets"
        targets.mkdir(parents=True, exist_ok=True)
        tmp = targets / f".{name}.tmp"
        tmp.write_bytes(orjson.dumps([{"targets": [address], "labels": {"component": name, **(labels or {})}}]))
        tmp.rename(targets / f"{name}.json")

    def component_names(self) -> list[str]:
        """The components `up` starts, in start order (no side effects: for help texts and status)."""
        optional = {"alertmanager": self.with_alertmanager, "prometheus": self.with_prometheus}
        return ["kafka"] + [name for name, wanted in optional.items() if wanted]

    def up(self, progress: Callable[[str, ManagedProcess], None] | None = None) -> list[ManagedProcess]:
        """Start every component in order; ``progress(event, comp)`` hears "starting", "ready",
        "already running" and "config reloaded" for each one as it happens (a start can take a minute: say
        which one waits)."""
        started: list[ManagedProcess] = []
        try:
            for comp in self.components():
                running = comp.running()
                if progress is not None:
                    progress("already running" if running else "starting", comp)
                comp.start()
                started.append(comp)
                if running and comp.name in RELOAD_ON_SIGHUP and comp.reload() and progress is not None:
                    progress("config reloaded", comp)
                if progress is not None and not running:
                    progress("ready", comp)
        except StackError:
            for comp in reversed(started):
                comp.stop()
            raise
        return started

    def start_component(self, name: str) -> ManagedProcess:
        """(Re)start one component with its existing data (fault tests stop and restart the broker)."""
        for comp in self.components():
            if comp.name == name:
                comp.start()
                return comp
        raise KeyError(name)

    def down(self) -> None:
        for comp in reversed(self._existing()):
            comp.stop()

    def status(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        for comp in self._existing():
            rec = comp.read_pid()
            out[comp.name] = {"running": comp.running(), "pid": rec[0] if rec else None,
                              "ports": {k: f"{h}:{p}" for k, (h, p) in comp.ports.items()},
                              "log": str(comp.logfile)}
        return out

    def component(self, name: str) -> ManagedProcess:
        for comp in self._existing():
            if comp.name == name:
                return comp
        raise KeyError(name)

    def _existing(self) -> list[ManagedProcess]:
        """Process handles for stop/status, without writing configs or formatting storage."""
        s = self.settings
        data = Path(s.data_dir)
        names = ["kafka", "alertmanager", "prometheus"]
        ports = {"kafka": {"client": (s.bind, s.kafka_port), "controller": (s.bind, s.kafka_controller_port)},
                 "alertmanager": {"web": (s.bind, s.alertmanager_port)},
                 "prometheus": {"web": (s.bind, s.prometheus_port)}}
        return [ManagedProcess(name=n, argv=[], workdir=data / n, ports=ports[n]) for n in names]
