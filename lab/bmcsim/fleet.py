"""Simulated BMCs on loopback: one OpenIPMI ``ipmi_sim`` process per BMC.

:class:`SimulatedBMC` writes a BMC's config (lan.conf, .emu, SDRs compiled with ``sdrcomp``) into
its own directory, starts ``ipmi_sim -n`` on a free UDP port of 127.0.0.1, waits until
ipmitool gets an answer, changes its wattage by rewriting a file the simulator polls (and the
DCMI extension reads on each request), and stops it by PID. :class:`BMCFleet` does the same for
many BMCs at once (start all, then wait for all), for tests and the benchmark.

Only for tests: the simulator's config holds the password in clear text (mode 0600, temp dir).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template
from collections.abc import Iterable

from opsloop.config import REPO_ROOT
from opsloop.paths import write_private

TEMPLATES = Path(__file__).resolve().parent / "templates"
EXTENSION_SOURCE = Path(__file__).resolve().parent / "dcmi_power.c"
EXTENSION = REPO_ROOT / ".cache" / "ipmi-sim" / "dcmi_power.so"
SETUP_SCRIPT = REPO_ROOT / "setup.d" / "30-ipmi-sim.sh"

POWER_SENSOR_NUMBER = 1
NO_READING_SENSOR_NUMBER = 2


class SimulatorError(RuntimeError):
    """A simulated BMC could not be built or started; the message says which and why."""


def ensure_extension() -> Path:
    """The DCMI extension, built by setup.d/30-ipmi-sim.sh when missing or older than its source."""
    if not EXTENSION.exists() or EXTENSION.stat().st_mtime < EXTENSION_SOURCE.stat().st_mtime:
        res = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=600)
        if res.returncode != 0 or not EXTENSION.exists():
            raise SimulatorError(f"building {EXTENSION} failed: {res.stderr[-500:]}")
    return EXTENSION


@dataclass(frozen=True)
class BMCSpec:
    """What one simulated BMC offers."""

    name: str
    watts: int | str = 155           # int, "cur min max avg", or "na" (no measurement)
    dcmi: bool = True                # load the DCMI extension
    sdr_power: bool = True           # an SDR sensor in Watts fed from the watts file
    sdr_no_reading: bool = False     # an SDR power sensor with nothing behind it: "No Reading"
    sdr_m: int = 1                   # SDR reading = M * raw; M=1 reads 0..255 W exactly
    username: str = "opsloop"
    password: str = "opsloop-sim-pw"  # noqa: S105 - a simulator's test credential
    dead: bool = False               # reserve a port, start nothing: a BMC that never answers
    poll_ms: int = 200


def _render(template: str, **values: object) -> str:
    return Template((TEMPLATES / template).read_text()).substitute({k: str(v) for k, v in values.items()})


def reserve_udp_ports(count: int) -> list[int]:
    """Free loopback UDP ports, distinct: all sockets are held until every port is chosen."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _bound_udp_ports() -> set[int]:
    ports: set[int] = set()
    with open("/proc/net/udp") as f:
        next(f)
        for line in f:
            local = line.split()[1]
            addr, port = local.split(":")
            if addr == "0100007F":
                ports.add(int(port, 16))
    return ports


class SimulatedBMC:
    """One ipmi_sim process: config in ``root/<name>/``, listening on 127.0.0.1:``port``."""

    def __init__(self, spec: BMCSpec, root: Path, port: int) -> None:
        for ch in spec.username + spec.password:
            if not (ch.isalnum() or ch in "-_."):
                raise SimulatorError(f"{spec.name}: use [A-Za-z0-9-_.] in simulator credentials (lan.conf quoting)")
        self.spec = spec
        self.port = port
        self.dir = Path(root) / spec.name
        self.watts_file = self.dir / "watts"
        self.password_file = self.dir / "password"
        self.proc: subprocess.Popen[bytes] | None = None
        self._write_config()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # --- configuration ------------------------------------------------------------------------

    def _write_config(self) -> None:
        s = self.spec
        state = self.dir / "state" / "ipmi_sim" / s.name  # where persist_sdr looks: <-s dir>/ipmi_sim/<name>/
        state.mkdir(parents=True, exist_ok=True)
        self.set_watts(s.watts)
        # 0600 from creation (write_text then chmod left a moment where anyone could read it)
        write_private(self.password_file, s.password + "\n")

        loadlib = ""
        if s.dcmi:
            loadlib = f'loadlib "{ensure_extension()}" "watts_file={self.watts_file}"'
        lan = _render("lan.cfg", name=s.name, port=self.port, guid=uuid.uuid4().hex,
                      username=s.username, password=s.password, loadlib=loadlib)
        write_private(self.dir / "lan.conf", lan)   # holds the password in clear

        sensors, sdrs = [], [_render("mc.sdrs", name=s.name)]
        if s.sdr_power:
            sensors.append(_render("power_sensor.emu", number=POWER_SENSOR_NUMBER, poll_ms=s.poll_ms,
                                   watts_file=self.watts_file, m=s.sdr_m, raw=self._raw(s.watts)))
            sdrs.append(_render("power_sensor.sdrs", number=POWER_SENSOR_NUMBER, m=s.sdr_m,
                                sensor_name="Pwr Consumption"))
        if s.sdr_no_reading:
            # An SDR record with no sensor_add behind it: Get Sensor Reading fails, ipmitool says "ns".
            sdrs.append(_render("power_sensor.sdrs", number=NO_READING_SENSOR_NUMBER, m=1, sensor_name="PSU2 Power"))
        (self.dir / "bmc.emu").write_text(_render("bmc.emu", name=s.name, sensors="\n".join(sensors)))
        (self.dir / "bmc.sdrs").write_text("\n".join(sdrs))
        res = subprocess.run(["sdrcomp", "-o", str(state / "sdr.20.main"), str(self.dir / "bmc.sdrs")],
                             capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise SimulatorError(f"{s.name}: sdrcomp failed: {res.stderr.strip() or res.stdout.strip()}")

    def _raw(self, watts: int | str) -> int:
        first = str(watts).split()[0] if str(watts).split() else ""
        return max(0, min(255, int(first) // self.spec.sdr_m)) if first.isdigit() else 0

    def set_watts(self, watts: int | str) -> None:
        """Change the reading: atomic rename, so the simulator never reads half a file."""
        tmp = self.watts_file.with_suffix(".tmp")
        tmp.write_text(f"{watts}\n")
        os.replace(tmp, self.watts_file)

    # --- process ------------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start ipmi_sim (not for dead BMCs). -n: no console on stdin/stdout, needed in the background."""
        if self.spec.dead or self.proc is not None:
            return
        log = open(self.dir / "ipmi_sim.log", "wb")
        try:
            self.proc = subprocess.Popen(
                ["ipmi_sim", "-n", "-c", str(self.dir / "lan.conf"), "-f", str(self.dir / "bmc.emu"),
                 "-s", str(self.dir / "state")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                start_new_session=True,
            )
        finally:
            log.close()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.dir / "ipmi_sim.log").read_text(errors="replace")[-400:]
            raise SimulatorError(f"{self.name}: ipmi_sim exited with {self.proc.returncode}: {log}")

    def ipmitool_argv(self, *command: str) -> list[str]:
        return ["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(self.port), "-U", self.spec.username,
                "-E", "-C", "3", "-N", "1", "-R", "1", *command]

    def ipmitool(self, *command: str, timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "IPMI_PASSWORD": self.spec.password, "LANG": "C"}
        return subprocess.run(self.ipmitool_argv(*command), capture_output=True, text=True, env=env,
                              timeout=timeout_s)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until the port is bound, then until ipmitool gets a Get Device ID answer."""
        if self.spec.dead:
            return
        deadline = time.monotonic() + timeout_s
        while self.port not in _bound_udp_ports():
            self.check_alive()
            if time.monotonic() > deadline:
                raise SimulatorError(f"{self.name}: port {self.port} not bound after {timeout_s}s")
            time.sleep(0.02)
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            res = self.ipmitool("raw", "0x06", "0x01", timeout_s=max(1.0, deadline - time.monotonic()))
            if res.returncode == 0:
                return
            last = (res.stderr or res.stdout).strip()
            time.sleep(0.05)
        raise SimulatorError(f"{self.name}: ipmitool got no answer on port {self.port}: {last[-300:]}")

    def start(self, timeout_s: float = 20.0) -> SimulatedBMC:
        self.spawn()
        self.wait_ready(timeout_s)
        return self

    def pause(self) -> None:
        """Freeze the BMC (SIGSTOP): packets arrive, nothing answers, like a hung BMC."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def terminate(self) -> None:
        """Ask our ipmi_sim to stop (SIGTERM to its PID's group: it was started in a new session)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self, timeout_s: float = 3.0) -> None:
        """Wait for the process to exit; SIGKILL it if it ignores SIGTERM."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop(self) -> None:
        self.terminate()
        self.reap()

    def inventory_entry(self, **metadata: object) -> dict[str, object]:
        """This BMC as a host of the collector's inventory (password by file reference)."""
        entry: dict[str, object] = {"name": self.name, "bmc": "127.0.0.1", "port": self.port,
                                    "username": self.spec.username, "password_file": str(self.password_file)}
        if metadata:
            entry["metadata"] = dict(metadata)
        return entry


class BMCFleet:
    """Many simulated BMCs: ``with BMCFleet(specs, root) as fleet: fleet["bmc1"].set_watts(248)``."""

    def __init__(self, specs: Iterable[BMCSpec], root: Path) -> None:
        specs = list(specs)
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise SimulatorError("BMC names must be unique")
        ports = reserve_udp_ports(len(specs))
        self.root = Path(root)
        self.bmcs: dict[str, SimulatedBMC] = {}
        for spec, port in zip(specs, ports):
            self.bmcs[spec.name] = SimulatedBMC(spec, self.root, port)

    def __getitem__(self, name: str) -> SimulatedBMC:
        return self.bmcs[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.bmcs.values())

    def __len__(self) -> int:
        return len(self.bmcs)

    def pids(self) -> list[int]:
        return [b.pid for b in self.bmcs.values() if b.pid is not None]

    def start(self, timeout_s: float = 60.0, check_workers: int = 8) -> BMCFleet:
        try:
            for b in self.bmcs.values():
                b.spawn()
            with ThreadPoolExecutor(max_workers=check_workers) as pool:
                list(pool.map(lambda b: b.wait_ready(timeout_s), self.bmcs.values()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for b in self.bmcs.values():
            b.terminate()
        for b in self.bmcs.values():
            b.reap()

    def inventory(self, metadata: dict[str, dict[str, object]] | None = None) -> dict[str, list[dict[str, object]]]:
        metadata = metadata or {}
        return {"hosts": [b.inventory_entry(**metadata.get(b.name, {})) for b in self.bmcs.values()]}

    def __enter__(self) -> BMCFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
