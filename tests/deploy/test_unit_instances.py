"""deploy/systemd: what each *instance* of a template unit gets once its drop-ins are applied, checked against
the real components an operator's host has.

- ``opsloop-collector@haproxy`` reads HAProxy's runtime API socket, which the weight actuator's drop-in asks to be
  ``stats socket ... mode 660 level admin group haproxy``: the collector runs as ``opsloop`` too, so it needs the
  ``haproxy`` group as well (before, only the actuator had it and every collector round failed "Permission
  denied"). Checked with a real HAProxy and the unit's credentials (setpriv + socat).
- Several collectors on one host (ipmi and keystone on a management host, iptables and netperf on a hypervisor):
  each instance needs its own /metrics port (before, all took ``collector.metrics_port``, and every one after the
  first exited 75 and was restarted every 5 s forever).
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import requests
import yaml

from opsloop.config import collector_names, defaults_document
from opsloop.stack.process import free_port
from tests.deploy.test_systemd_units import INSTALLED, OPSLOOP, UNITS
from tests.helpers import wait_until

NOBODY = 65534   # stands in for the `opsloop` user (the socket is root's: only its group bits matter)


def effective_service(template: str, instance: str) -> dict[str, object]:
    """The [Service] settings systemd gives ``template`` instantiated as ``instance``: the unit, then the drop-ins
    of ``<template>.d/`` and ``<instance unit>.d/`` in file-name order (the instance's wins on a shared name).
    Environment= assignments override by name; SupplementaryGroups= accumulates (empty resets)."""
    unit = template.replace("@.", f"@{instance}.")
    dropins: dict[str, Path] = {}
    for folder in (UNITS / f"{template}.d", UNITS / f"{unit}.d"):
        dropins.update({p.name: p for p in sorted(folder.glob("*.conf"))})
    env: dict[str, str] = {}
    groups: list[str] = []
    out: dict[str, object] = {"env": env, "groups": groups}
    for path in [UNITS / template, *(dropins[n] for n in sorted(dropins))]:
        section = ""
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = line
                continue
            if section != "[Service]":
                continue
            key, _, value = line.partition("=")
            value = value.replace("%i", instance)
            if key == "Environment":
                name, _, val = value.partition("=")
                env[name] = val
            elif key == "SupplementaryGroups":
                groups[:] = groups + value.split() if value else []
            else:
                out[key] = value
    return out


def collector_metrics_port(name: str) -> int:
    """The /metrics port of ``opsloop-collector@name`` under a config that sets none: its unit's, else the default."""
    env: dict[str, str] = effective_service("opsloop-collector@.service", name)["env"]   # type: ignore[assignment]
    return int(env.get("OPSLOOP__COLLECTOR__METRICS_PORT", defaults_document()["collector"]["metrics_port"]))


def test_each_collector_instance_has_its_own_metrics_port() -> None:
    """Every collector `opsloop collect` knows gets a port no other collector and no other unit's service takes
    (a host may run all of them: the docs' example enables stream, edge, paging, an actuator and a collector)."""
    for name in collector_names():
        env: dict[str, str] = effective_service("opsloop-collector@.service", name)["env"]   # type: ignore[assignment]
        assert "OPSLOOP__COLLECTOR__METRICS_PORT" in env, f"opsloop-collector@{name}: no /metrics port of its own"
    ports = {name: collector_metrics_port(name) for name in collector_names()}
    assert len(set(ports.values())) == len(ports), ports
    d = defaults_document()   # what `opsloop config defaults` prints
    ctl = d["controllers"]
    others = {"stream": d["stream"]["metrics_port"], "stream web": d["stream"]["web_port"],
              "paging": ctl["paging"]["metrics_port"], "actuator": ctl["actuator"]["metrics_port"],
              "edge": ctl["edge"]["metrics_port"], "edge api": ctl["edge"]["api"]["port"]}
    assert not set(ports.values()) & set(others.values()), (ports, others)
    # the units' own settings (a config's ports apply to every other service) are the defaults above
    for unit in ("opsloop-stream.service", "opsloop-paging.service", "opsloop-edge.service"):
        assert not any("PORT" in k for k in effective_service(unit, "")["env"]), unit   # type: ignore[union-attr]


@pytest.mark.integration
def test_two_collectors_on_one_host_both_serve_metrics(tmp_path: Path) -> None:
    """The haproxy and ipmi collectors (as in `make run`) started on one host as their units start them."""
    names = ("haproxy", "ipmi")
    unit_ports = {n: collector_metrics_port(n) for n in names}
    # each distinct port of the units stands for one free port here (the units' fixed ports may be taken on a
    # test machine, by a `make run`): two instances given the same port by their units still share one
    free = {p: free_port() for p in set(unit_ports.values())}
    ports = {n: free[p] for n, p in unit_ports.items()}
    config = tmp_path / "opsloop.yaml"
    config.write_text(yaml.safe_dump({
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},   # away: the collectors spool and go on
        "collectors": {"haproxy": {"instances": {"lb1": str(tmp_path / "admin.sock")}},
                       "ipmi": {"hosts": [{"name": "bmc1", "bmc": "127.0.0.1", "password_env": "NO_SUCH_VAR"}]}}}))
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def own_metrics_or_exited(n: str) -> bool:
        """``n``'s /metrics answers with its own series (not another collector's on the same port), or it ended."""
        if procs[n].poll() is not None:
            return True
        try:
            r = requests.get(f"http://127.0.0.1:{ports[n]}/metrics", timeout=2)
        except requests.RequestException:
            return False
        return r.ok and f'opsloop_spool_records{{collector="{n}"}}' in r.text

    try:
        for n in names:   # one after the other: the second starts while the first holds its port
            unit = effective_service("opsloop-collector@.service", n)
            env = {k: v for k, v in os.environ.items() if not k.startswith("OPSLOOP")}
            env.update({k: v.replace("/var/lib/opsloop", str(tmp_path / "var"))
                        for k, v in unit["env"].items()})   # type: ignore[union-attr]
            env["OPSLOOP_CONFIG"] = str(config)
            env["OPSLOOP__COLLECTOR__METRICS_PORT"] = str(ports[n])
            argv = str(unit["ExecStart"]).split()
            assert argv[0] == INSTALLED
            with open(tmp_path / f"{n}.stderr", "wb") as err:   # a file: a full pipe would block the service
                procs[n] = subprocess.Popen([str(OPSLOOP), *argv[1:]], cwd=tmp_path, env=env,
                                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            wait_until(lambda: own_metrics_or_exited(n), timeout=60, interval=0.2, what=f"collector {n}'s /metrics")
            assert procs[n].poll() is None, (f"opsloop-collector@{n} exited {procs[n].returncode} (75: its /metrics "
                                             f"port taken): {(tmp_path / f'{n}.stderr').read_text()[-1500:]}")
        assert all(proc.poll() is None for proc in procs.values())
    finally:
        for proc in procs.values():
            stop(proc)


def stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """End a process this test started, by its own handle (SIGTERM, then SIGKILL after 30 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def haproxy_socket() -> Iterator[Path]:
    """A real HAProxy whose runtime API socket is set up as deploy/systemd's actuator drop-in asks
    (``stats socket ... mode 660 level admin group haproxy``), in a folder others may traverse."""
    folder = Path(tempfile.mkdtemp(prefix="opsloop-sock-", dir="/tmp"))
    folder.chmod(0o711)
    sock = folder / "admin.sock"
    cfg = folder / "haproxy.cfg"
    cfg.write_text(f"""global
  stats socket {sock} mode 660 level admin group haproxy
  user haproxy
  group haproxy
defaults
  mode http
  timeout connect 1s
  timeout client 5s
  timeout server 5s
frontend fe
  bind 127.0.0.1:{free_port()}
  default_backend be_web
backend be_web
  server near 127.0.0.1:{free_port()} weight 100
""")
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.is_socket() or proc.poll() is not None, timeout=30, interval=0.1,
                   what="HAProxy's admin socket")
        assert proc.poll() is None, proc.stderr.read()   # type: ignore[union-attr]
        yield sock
    finally:
        stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.parametrize("template,instance", [("opsloop-collector@.service", "haproxy"),
                                               ("opsloop-actuator@.service", "ams1")])
def test_haproxy_socket_readable_with_the_units_credentials(haproxy_socket: Path, template: str,
                                                            instance: str) -> None:
    s = effective_service(template, instance)
    assert s["User"] == "opsloop" and s["Group"] == "opsloop", s
    gids = [str(grp.getgrnam(g).gr_gid) for g in s["groups"]]   # type: ignore[union-attr]
    creds = ["--groups=" + ",".join(gids)] if gids else ["--clear-groups"]
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", *creds,
                        "socat", "-t", "5", "-", f"UNIX-CONNECT:{haproxy_socket}"],
                       input="show stat\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("# pxname,svname"), \
        f"{template.replace('@.', f'@{instance}.')} cannot read {haproxy_socket}: {r.stderr.strip()}"
