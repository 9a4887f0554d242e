"""Every module imports, and all of them together in one process: a metric name registered twice
(two modules defining the same Prometheus metric) fails here instead of in some test's collection."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import pytest

PACKAGES = ("opsloop", "opsloop.collectors", "opsloop.streams", "opsloop.controllers", "opsloop.lab", "bench")


def all_modules() -> list[str]:
    out = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        out.append(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg_name}."):
            if info.name.endswith("__main__"):
                continue
            out.append(info.name)
    return out


def test_every_module_imports_in_one_process() -> None:
    failures = {}
    for name in all_modules():
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - collect them all, report at once
            failures[name] = f"{type(e).__name__}: {e}"
    assert not failures, failures


@pytest.mark.parametrize("pkg", PACKAGES)
def test_packages_have_modules(pkg: str) -> None:
    assert any(m.startswith(f"{pkg}.") for m in all_modules())


# What validating a config file must not load: the solver and the clients (half a second or more each,
# paid by every `opsloop config check` and every command's `--help` that reads a settings model).
HEAVY = ("scipy", "elasticsearch", "kafka", "faust")


def test_config_models_load_without_the_solver_or_the_clients() -> None:
    # `opsloop config defaults` validates every section and every collector's model, as `config check` does
    code = ("import contextlib, io, json, sys\n"
            "from opsloop.config_cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['defaults']) == 0\n"
            "import opsloop.controllers.actuators.config, opsloop.audit.settings, opsloop.audit.cli\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [], out.stdout


# The edge control loop's gauges, exported only by the process that runs it: the actuator (and `opsloop run`)
# imported them through the edge section's validation (its token file reader), so their /metrics showed
# `opsloop_edge_last_tick_timestamp_seconds 0` and EdgeControllerStuck paged for every such service.
EDGE_LOOP_GAUGES = ("opsloop_edge_last_tick_timestamp_seconds", "opsloop_edge_interval_seconds")
OTHER_SERVICES = ("opsloop.controllers.actuators.service", "opsloop.controllers.actuators.cli",
                  "opsloop.controllers.paging.cli", "opsloop.streams.cli", "opsloop.collect.cli",
                  "opsloop.lab.pipeline")


@pytest.mark.parametrize("module", OTHER_SERVICES)
def test_other_services_do_not_export_the_edge_loops_gauges(module: str) -> None:
    code = ("import contextlib, io, json\n"
            "from prometheus_client import REGISTRY\n"
            "from opsloop.config_cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert main(['defaults']) == 0\n"      # every section validated, the edge one included
            f"import {module}\n"
            "print(json.dumps(sorted({s.name for m in REGISTRY.collect() for s in m.samples})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    exported = set(json.loads(out.stdout))
    assert exported.isdisjoint(EDGE_LOOP_GAUGES), sorted(exported & set(EDGE_LOOP_GAUGES))
