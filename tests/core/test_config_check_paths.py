"""`opsloop config check` looks at the paths the file names: a file setting that names a directory, or a
`*_dir` setting that names a file, passed the check and the service then exited 78 at start. A file read at
start that is missing is a warning (the check may run where the secrets are not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from opsloop.config_cli import main as config_main
from tests.helpers import REPO

HEAVY = ("scipy", "elasticsearch", "kafka", "faust")


def _write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "opsloop.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_directory_for_a_file_and_a_file_for_a_directory_are_errors(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "adir"
    d.mkdir()
    (tmp_path / "topology.yaml").mkdir()   # relative to the config file, as the edge service reads it
    doc = {"collector": {"spool_dir": str(tmp_path / "opsloop.yaml")},
           "kafka": {"security": {"protocol": "SSL", "ssl_cafile": str(d)}},
           "controllers": {"edge": {"topology_file": "topology.yaml"}},
           "collectors": {"ipmi": {"inventory": str(d)},
                          "keystone": {"url": "http://127.0.0.1:5000", "frontend": {"access_logs": [str(d)]}}}}
    assert config_main(["check", str(_write(tmp_path, doc))]) == 2
    err = capsys.readouterr().err
    for line in (f"kafka.security.ssl_cafile: {d} is a directory, expected a file",
                 f"collector.spool_dir: {tmp_path / 'opsloop.yaml'} is not a directory",
                 f"collectors.ipmi.inventory: {d} is a directory, expected a file",
                 f"collectors.keystone.frontend.access_logs.0: {d} is a directory, expected a file",
                 f"controllers.edge.topology_file: {tmp_path / 'topology.yaml'} is a directory, expected a file"):
        assert f"\n  {line}" in err, err
    assert "5 errors" in err, err


def test_a_missing_file_read_at_start_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"collectors": {"ipmi": {"inventory": str(tmp_path / "bmcs.yaml")}},
           "controllers": {"edge": {"topology_file": "topology.yaml"}}}
    assert config_main(["check", str(_write(tmp_path, doc))]) == 0
    err = capsys.readouterr().err
    assert (f"warning: config file {tmp_path / 'opsloop.yaml'}: collectors.ipmi.inventory: "
            f"{tmp_path / 'bmcs.yaml'}: no such file here") in err, err
    assert f"controllers.edge.topology_file: {tmp_path / 'topology.yaml'}: no such file here" in err, err


def test_good_paths_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "topology.yaml").write_text("listeners: []\n")
    doc = {"collector": {"spool_dir": str(tmp_path / "spool")},   # missing: made at start
           "controllers": {"edge": {"topology_file": "topology.yaml"}}}
    assert config_main(["check", str(_write(tmp_path, doc))]) == 0
    assert capsys.readouterr().err == ""


def test_the_check_of_paths_loads_no_client_or_solver(tmp_path: Path) -> None:
    d = tmp_path / "adir"
    d.mkdir()
    cfg = _write(tmp_path, {"controllers": {"edge": {"topology_file": str(d)}},
                            "audit": {"elasticsearch": {"hosts": ["https://es:9200"], "ca_file": str(d)}},
                            "collectors": {"ipmi": {"inventory": str(d)}}})
    code = ("import contextlib, io, json, sys\n"
            "from opsloop.config_cli import main\n"
            "with contextlib.redirect_stderr(io.StringIO()) as err:\n"
            f"    assert main(['check', {str(cfg)!r}]) == 2\n"
            "assert 'audit.elasticsearch.ca_file' in err.getvalue(), err.getvalue()\n"
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [], out.stdout
