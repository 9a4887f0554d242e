"""A real Keystone (PyPI ``keystone`` 30.x) under uWSGI on loopback, for the tests and a try by hand.

Lay-out of the work directory::

    etc/keystone.conf      rendered from keystone.conf.tmpl (caching on/off)
    keystone.db            SQLite
    fernet-keys/ credential-keys/ fernet-receipts/
    access.log             uWSGI request log in the opsloop logformat (per-request msecs)
    uwsgi.log keystone.log

Setup is ``keystone-manage db_sync``, ``fernet_setup``, ``credential_setup``, ``bootstrap``
(the admin password goes through the environment, never argv). uWSGI runs with the ``http``
router (keep-alive clients), a stats server and the opsloop request logformat (per-request msecs). Everything lives in its own process group and is stopped by PID.
Keystone and uWSGI come from ``.cache/keystone-venv`` (setup.d/40-keystone.sh).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from string import Template

import requests

from opsloop.collectors.keystone.uwsgi_log import LOGFORMAT
from opsloop.config import REPO_ROOT
from opsloop.stack import free_port  # below the ephemeral range: see its docstring

DEFAULT_VENV = REPO_ROOT / ".cache" / "keystone-venv"
TEMPLATE = Path(__file__).with_name("keystone.conf.tmpl")
MANAGE_TIMEOUT_S = 180


class KeystoneServerError(RuntimeError):
    """The test Keystone could not be set up or started; the message says which step and why."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the group led by ``proc`` (started with start_new_session), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=grace_s)


@dataclass(frozen=True, slots=True)
class AdminCredentials:
    username: str
    password: str
    project: str = "admin"


class KeystoneServer:
    """One Keystone: set up once (DB, keys, bootstrap), its uWSGI restartable with caching on or off."""

    def __init__(self, workdir: Path, caching: bool = True, workers: int = 2, venv: Path = DEFAULT_VENV) -> None:
        self.workdir = Path(workdir)
        self.caching = caching
        self.workers = workers
        self.venv = Path(venv)
        self.port = free_port()
        self.stats_port = free_port()
        self.admin = AdminCredentials("admin", secrets.token_urlsafe(18))
        self._proc: subprocess.Popen[bytes] | None = None

    # --- paths ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats_address(self) -> str:
        return f"127.0.0.1:{self.stats_port}"

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    @property
    def etc(self) -> Path:
        return self.workdir / "etc"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    # --- setup ---------------------------------------------------------------------------------
    def _check_venv(self) -> None:
        for tool in ("uwsgi", "keystone-manage"):
            if not (self.venv / "bin" / tool).exists():
                raise KeystoneServerError(f"{self.venv / 'bin' / tool} is missing: run `make setup` "
                                          "(setup.d/40-keystone.sh installs Keystone and uWSGI)")

    def _render_config(self) -> None:
        self.etc.mkdir(parents=True, exist_ok=True)
        text = Template(TEMPLATE.read_text()).substitute(workdir=self.workdir,
                                                         caching="true" if self.caching else "false")
        (self.etc / "keystone.conf").write_text(text)

    def _manage(self, *args: str, env_extra: dict[str, str] | None = None) -> None:
        argv = [str(self.venv / "bin" / "keystone-manage"), "--config-file", str(self.etc / "keystone.conf"), *args]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env_extra or {})}
        try:
            done = subprocess.run(argv, env=env, capture_output=True, timeout=MANAGE_TIMEOUT_S,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            raise KeystoneServerError(f"keystone-manage {args[0]} ran past {MANAGE_TIMEOUT_S} s") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace")[-1500:]
            raise KeystoneServerError(f"keystone-manage {args[0]} exited {done.returncode}: {err}")

    def setup(self) -> None:
        self._check_venv()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._render_config()
        self._manage("db_sync")
        owner = ["--keystone-user", str(os.getuid()), "--keystone-group", str(os.getgid())]
        self._manage("fernet_setup", *owner)
        self._manage("credential_setup", *owner)
        self._manage("bootstrap", "--bootstrap-username", self.admin.username,
                     "--bootstrap-project-name", self.admin.project,
                     "--bootstrap-admin-url", f"{self.url}/v3", "--bootstrap-public-url", f"{self.url}/v3",
                     "--bootstrap-internal-url", f"{self.url}/v3", "--bootstrap-region-id", "RegionOne",
                     env_extra={"OS_BOOTSTRAP_PASSWORD": self.admin.password})

    # --- uWSGI ---------------------------------------------------------------------------------
    def _uwsgi_argv(self) -> list[str]:
        return [
            str(self.venv / "bin" / "uwsgi"),
            "--master", "--die-on-term", "--need-app", "--strict",
            "--http", f"127.0.0.1:{self.port}", "--http-keepalive",
            "--module", "keystone.wsgi.api:application",
            "--processes", str(self.workers), "--threads", "1",
            "--stats", self.stats_address,
            "--logto", str(self.workdir / "uwsgi.log"),
            "--req-logger", f"file:{self.access_log}",
            "--logformat", LOGFORMAT,
        ]

    def start(self, ready_timeout_s: float = 120.0) -> None:
        if self.pid:
            return
        # Through the process environment, not uWSGI's --env: pyuwsgi's Python has read os.environ
        # before uWSGI parses its options, so --env would not reach Keystone.
        env = {**os.environ, "OS_KEYSTONE_CONFIG_DIR": str(self.etc), "PYTHONWARNINGS": "ignore"}
        self._proc = subprocess.Popen(self._uwsgi_argv(), cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise KeystoneServerError(f"uWSGI exited {self._proc.returncode} while starting Keystone:\n"
                                          f"{_tail(self.workdir / 'uwsgi.log')}")
            try:
                if requests.get(f"{self.url}/v3", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise KeystoneServerError(f"Keystone on {self.url} not ready after {ready_timeout_s:g} s:\n"
                                  f"{_tail(self.workdir / 'uwsgi.log')}")

    def stop(self) -> None:
        if self._proc is not None:
            stop_process_group(self._proc)
            self._proc = None

    def set_caching(self, enabled: bool) -> None:
        """Switch ``[cache] enabled`` (and token caching): re-render the config, restart uWSGI."""
        if enabled == self.caching and self.pid:
            return
        self.caching = enabled
        self._render_config()
        self.stop()
        self.start()

    def copytruncate_access_log(self) -> Path:
        """Rotate the request log the way logrotate's ``copytruncate`` does. uWSGI's ``--req-logger file:``
        is not reopened by ``--log-reopen``/``--touch-logreopen`` (those reopen ``--logto`` only), and it
        writes with O_APPEND, so copy + truncate in place is the rotation that works without a reload."""
        rotated = self.access_log.with_name(self.access_log.name + ".1")
        rotated.write_bytes(self.access_log.read_bytes())
        with open(self.access_log, "r+b") as f:
            f.truncate(0)
        return rotated

    def __enter__(self) -> "KeystoneServer":
        self.setup()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
