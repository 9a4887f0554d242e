"""`command: [sudo, /usr/sbin/ipvsadm]` (or any wrapper) and an ipvsadm that hangs (a wedged netlink call,
a locked xtables): on timeout subprocess.run killed only the wrapper, and ipvsadm lived on. One leaked
per retry of the back-off, and a leaked write could still land after a newer apply, putting old weights
back. Now the command runs in a process group of its own and the whole group is killed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsloop.controllers.actuators.base import ActuatorError
from opsloop.controllers.actuators.config import LvsTargetConfig
from opsloop.controllers.actuators.lvs import LvsTarget
from tests.helpers import wait_until


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ipvsadm.pid"
    yield path
    if path.exists() and alive(pid := int(path.read_text())):   # a leak of this test: stop it by its pid
        os.kill(pid, signal.SIGKILL)


def test_a_hung_ipvsadm_under_a_wrapper_is_killed_with_it(pidfile: Path) -> None:
    # the wrapper (sudo) forks the tool (here: a sleeper standing for a hung ipvsadm) and waits for it
    wrapper = ["sh", "-c", f'sleep 300 & echo $! > {pidfile}; wait', "sudo"]
    cfg = LvsTargetConfig(kind="lvs", edge="e", listener="l", service="tcp:192.0.2.10:443",
                          reals={"eu": "10.0.0.1:443"}, command=wrapper, timeout_s=0.5)
    with pytest.raises(ActuatorError, match="timed out") as e:
        LvsTarget(cfg).read()
    assert e.value.kind == "unreachable"
    pid = int(pidfile.read_text())
    wait_until(lambda: not alive(pid), timeout=10, what=f"the hung tool (pid {pid}) to be gone")
