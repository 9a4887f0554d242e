"""A stack already running when `opsloop run` starts (a new user's `opsloop stack up`, then `make run`) is
reused, and Alertmanager runs the config `opsloop run` wrote, receivers pointed at the lab pager. Before, it
kept the one it was started with (the null receiver of `opsloop stack up`): every page went nowhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import yaml

from opsloop.config import StackSettings
from opsloop.stack import Stack, free_port
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def running_config(stack: Stack) -> str:
    return str(requests.get(f"{stack.alertmanager_url}/api/v2/status", timeout=5).json()["config"]["original"])


def test_up_reloads_alertmanager_already_running_with_another_config(tmp_path: Path) -> None:
    settings = StackSettings(data_dir=tmp_path / "stack", kafka_port=free_port(), kafka_controller_port=free_port(),
                             prometheus_port=free_port(), alertmanager_port=free_port(), scrape_targets=[])
    first = Stack(settings, with_prometheus=False)        # `opsloop stack up`: the null receiver
    hook = f"http://127.0.0.1:{free_port()}/lab-pager"
    lab = tmp_path / "lab-alertmanager.yml"
    lab.write_text(yaml.safe_dump({"route": {"receiver": "pager"},
                                   "receivers": [{"name": "pager", "webhook_configs": [{"url": hook}]}]}))
    try:
        first.up()
        assert hook not in running_config(first)
        pids = {name: s["pid"] for name, s in first.status().items()}
        events: list[tuple[str, str]] = []
        again = Stack(settings, alertmanager_config=lab, with_prometheus=False)   # `opsloop run`'s
        again.up(progress=lambda event, comp: events.append((event, comp.name)))
        assert {name: s["pid"] for name, s in again.status().items()} == pids   # reused, not restarted
        wait_until(lambda: hook in running_config(again), timeout=60, interval=0.2,
                   what="Alertmanager to run the config written by the second up()")
        assert ("config reloaded", "alertmanager") in events
    finally:
        first.down()
