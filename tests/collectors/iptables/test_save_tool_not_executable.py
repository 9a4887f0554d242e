"""``backend: auto`` with a save tool that is installed but not executable, run directly (no wrapper, no
netns): a ``tool`` error naming the file, not the backend skipped as "not installed". Before, run_tool's
PermissionError became a missing tool and the round went on with the other backend alone, silently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from opsloop.collect import tool as tool_module
from opsloop.collectors.iptables import Config, build

pytestmark = pytest.mark.integration


def _host_with(bindir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools' PATH: iptables-nft-save as installed, iptables-legacy-save there without its x bit."""
    bindir.mkdir()
    (bindir / "iptables-nft-save").symlink_to("/usr/sbin/xtables-nft-multi")
    legacy = bindir / "iptables-legacy-save"
    legacy.write_bytes(Path(shutil.which("xtables-legacy-multi") or "/usr/sbin/xtables-legacy-multi").read_bytes())
    legacy.chmod(0o644)   # a package unpacked without modes, or a noexec mount
    monkeypatch.setitem(tool_module._ENV, "PATH", str(bindir))


def test_auto_backend_with_a_non_executable_save_tool_is_a_tool_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _host_with(tmp_path / "bin", monkeypatch)
    ports = tmp_path / "ports.json"
    ports.write_text(json.dumps([{"port_id": "aaaaaaaa-1111-4222-8333-444455556666", "vm": "vm0"}]))
    cfg = Config.model_validate({"targets": [{"host": "hv1", "ports_file": str(ports)}], "families": ["ipv4"]})
    rnd = build(cfg).collect()
    # before: errors == [], the ruleset read from nft alone as if legacy were not installed
    assert [(e.target, e.kind) for e in rnd.errors] == [("hv1", "tool")], rnd.errors
    msg = rnd.errors[0].message
    assert f"'iptables-legacy-save' ({tmp_path / 'bin' / 'iptables-legacy-save'}): not executable" in msg, msg
    assert not [m for m in rnd.metrics if m.name in ("iptables_vm_port", "iptables_ruleset")]
    # the same file executable: read as usual, both backends
    (tmp_path / "bin" / "iptables-legacy-save").chmod(0o755)
    rnd = build(cfg).collect()
    assert rnd.errors == [], rnd.errors
