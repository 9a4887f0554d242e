"""The wheel works outside the checkout.

Built from a copy of the packaged folders, installed with ``--no-index`` (dependencies from
.cache/wheelhouse, made by setup.d/22-wheelhouse.sh) into a fresh virtualenv in a temporary folder, and
run from a directory that is not the checkout, with an environment that does not point at it: the
version, ``config check``, ``page render-config`` (the Alertmanager config and templates must be inside
the package) and one round of the HAProxy collector against a real HAProxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".cache" / "wheelhouse"
# What the wheel is built from; bench/ and tests/ are deliberately absent.
SOURCES = ["opsloop", "collectors", "streams", "controllers", "lab", "alerts", "dashboards",
           "setup.py", "pyproject.toml", "README.md"]
STAGES = ("collectors", "streams", "controllers")


class Installed:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "venv" / "bin"
        self.cwd = root / "elsewhere"        # not the checkout, nothing of it on the path
        self.cwd.mkdir()
        self.site = Path(self.python("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                         .stdout.strip())

    def env(self) -> dict[str, str]:
        keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def run(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "opsloop"), *argv], cwd=self.cwd, env={**self.env(), **(env or {})},
                              capture_output=True, text=True, timeout=120)

    def python(self, *argv: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(self.bin / "python"), *argv], cwd=self.cwd, env=self.env(), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r


def _check(r: subprocess.CompletedProcess[str], what: str) -> None:
    assert r.returncode == 0, f"{what} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    if not (WHEELHOUSE / ".complete").is_file():
        pytest.fail(f"{WHEELHOUSE} is missing: run `make setup` (setup.d/22-wheelhouse.sh) first")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    dist = root / "dist"
    # --no-build-isolation: the checkout's venv has the pinned setuptools; nothing is fetched.
    _check(subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300), "pip wheel")
    (wheel,) = dist.glob("opsloop-*.whl")
    venv.create(root / "venv", with_pip=True)
    _check(subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                           "--find-links", str(WHEELHOUSE), str(wheel)], capture_output=True, text=True,
                          timeout=600, cwd=root), "pip install")
    shutil.rmtree(src)   # nothing of the sources remains for the installed package to lean on
    return Installed(root)


def test_installs_one_top_level_package_with_its_data(installed: Installed) -> None:
    out = installed.python("-c", "import importlib.metadata as m, json; "
                                 "print(json.dumps([str(f) for f in m.files('opsloop')]))").stdout
    files = json.loads(out)
    tops = {f.split("/")[0] for f in files if not f.startswith(("opsloop-", "../"))}
    assert tops == {"opsloop"}, tops
    for stage in (*STAGES, "lab", "bench", "tests", "alerts", "dashboards"):
        assert not (installed.site / stage).exists(), f"top-level {stage}/ installed into site-packages"
    shipped = installed.site / "opsloop"
    assert (shipped / "alerts" / "alertmanager.yml").is_file()
    assert (shipped / "alerts" / "templates" / "opsloop.tmpl").is_file()
    assert {p.name for p in (REPO / "alerts" / "rules").glob("*.yml")} == \
        {p.name for p in (shipped / "alerts" / "rules").glob("*.yml")}
    assert {p.name for p in (REPO / "dashboards").glob("*.json")} == \
        {p.name for p in (shipped / "dashboards").glob("*.json")}
    assert not list((shipped / "dashboards").glob("*.py"))       # the generator is a development tool
    assert (shipped / "collectors" / "ipmi" / "__init__.py").is_file()
    # The stages import by their namespaced names, and the old names do not exist.
    r = installed.python("-c", "import importlib.util as u, opsloop.collectors.haproxy, opsloop.streams.worker, "
                               "opsloop.controllers.paging.cli, opsloop.lab.pipeline, opsloop.lab.bmcsim; "
                               "print([n for n in ('collectors', 'streams', 'controllers', 'lab', 'bench', "
                               "'opsloop.pipeline') if u.find_spec(n)])")
    assert r.stdout.strip() == "[]"


def test_version(installed: Installed) -> None:
    with open(REPO / "pyproject.toml", "rb") as f:
        version = tomllib.load(f)["project"]["version"]
    r = installed.run("--version")
    _check(r, "opsloop --version")
    assert r.stdout.strip() == version


def test_config_check_validates_every_section(installed: Installed) -> None:
    good = installed.cwd / "good.yaml"
    good.write_text(yaml.safe_dump({
        "collectors": {"haproxy": {"instances": {"lb1": "/run/haproxy/admin.sock"}}},
        "streams": {"detectors": {"anomaly": {"enabled": False}}},
        "controllers": {"paging": {"resend_interval_s": 30}}}))
    r = installed.run("config", "check", str(good))
    _check(r, "config check")
    bad = installed.cwd / "bad.yaml"
    bad.write_text(yaml.safe_dump({"controllers": {"paging": {"resend_interval_s": -1}},
                                   "collectors": {"nosuch": {}}}))
    r = installed.run("config", "check", str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    # The stage sections are found through the installed entry points, and the collectors by module name.
    assert "controllers.paging.resend_interval_s" in r.stderr
    assert "collectors.nosuch" in r.stderr


def test_state_defaults_to_var_lib_and_follows_state_dir(installed: Installed) -> None:
    r = installed.run("config", "defaults")
    _check(r, "config defaults")
    doc = yaml.safe_load(r.stdout)
    assert doc["stream"]["data_dir"] == "/var/lib/opsloop/streams"
    assert doc["collector"]["spool_dir"] == "/var/lib/opsloop/spool"
    assert ".run" not in r.stdout and str(installed.site) not in r.stdout
    state = installed.root / "state"
    r = installed.run("--state-dir", str(state), "config", "defaults")
    _check(r, "config defaults --state-dir")
    assert yaml.safe_load(r.stdout)["stream"]["data_dir"] == str(state / "streams")
    r = installed.run("config", "defaults", env={"OPSLOOP_STATE_DIR": str(state)})
    assert yaml.safe_load(r.stdout)["controllers"]["paging"]["state_file"] == str(state / "paging" / "state.json")


def test_page_render_config_uses_the_shipped_alertmanager_config(installed: Installed) -> None:
    key = installed.cwd / "routing.key"
    key.write_text("k" * 32)
    key.chmod(0o600)
    r = installed.run("page", "render-config", "--webhook-url", "http://127.0.0.1:8099",
                      "--routing-key-file", str(key))
    _check(r, "page render-config")
    doc = yaml.safe_load(r.stdout)
    hooks = [h["url"] for rc in doc["receivers"] for h in rc.get("webhook_configs", [])]
    assert hooks and all(re.fullmatch(r"http://127\.0\.0\.1:8099/[\w-]+", u) for u in hooks), hooks
    assert doc["templates"], "the shipped config names its templates"
    for t in doc["templates"]:
        assert Path(t).is_relative_to(installed.site / "opsloop" / "alerts"), t
        assert list(Path(t).parent.glob(Path(t).name)), f"template {t} is not in the package"


def test_one_haproxy_collector_round(installed: Installed, lab_edge) -> None:
    lab_edge.start()
    cfg = installed.cwd / "collect.yaml"
    cfg.write_text(yaml.safe_dump({"collectors": {"haproxy": {"instances": {"lab-edge": str(lab_edge.admin_socket)}}}}))
    r = installed.run("collect", "haproxy", "--once", "--stdout", "--config", str(cfg))
    _check(r, "collect haproxy --once --stdout")
    samples = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert not [s for s in samples if "error" in s], samples
    servers = {s["tags"]["sv"] for s in samples if s.get("tags", {}).get("type") == "server"}
    assert servers == {o.name for o in lab_edge.origins}, samples
    assert all(s["tags"]["host"] == "lab-edge" for s in samples)
    assert not (installed.site / ".run").exists()
