"""A weight history line that is JSON of the right shape but wrong types (a hand edit, disk damage): the
store checked only version, epoch and that weights was an object, so ``"near": "lots"`` or an
``applied_at`` of ``"yesterday"`` loaded; then `weights history` died in a traceback, `weights rollback`
said only ``invalid literal for int()``, and every apply failed on it, naming neither file nor line.
Now the line is damage like any other: StoreError naming the file and the line, the live weights held."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from opsloop.controllers.actuators.store import StoreError, WeightStore
from tests.helpers import captured_logs, run_cli, write_config

GOOD = {"version": 1, "epoch": 0, "weights": {"near": 128, "far": 128}, "shares": {"near": 0.5, "far": 0.5},
        "decision": {"near": 0.5, "far": 0.5}, "applied_at": 1795400000.0}
DAMAGE = [
    {"weights": {"near": "lots", "far": 3}},
    {"weights": {"near": 1.5, "far": 3}},
    {"weights": {"near": True, "far": 3}},
    {"shares": "x"},
    {"decision": None},
    {"applied_at": "yesterday"},
    {"computed_at": [1]},
    {"complete": "yes"},
    {"action": "nuke"},
    {"reason": {"a": 1}},
]


def damaged_store(root: Path, damage: dict[str, object]) -> WeightStore:
    store = WeightStore(root, "e1", "web")
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(orjson.dumps(GOOD) + b"\n" + orjson.dumps({**GOOD, "version": 2, **damage}) + b"\n")
    return store


def test_a_good_history_loads(tmp_path: Path) -> None:
    store = damaged_store(tmp_path, {})
    assert [e.version for e in store.history()] == [1, 2]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda d: ",".join(d))
def test_a_line_of_wrong_types_is_damage_naming_file_and_line(tmp_path: Path, damage: dict[str, object]) -> None:
    store = damaged_store(tmp_path, damage)
    with pytest.raises(StoreError, match=rf"{store.path} line 2: not a history entry"):
        store.history()


def test_the_cli_says_which_file_and_line(tmp_path: Path) -> None:
    store = damaged_store(tmp_path / "store", DAMAGE[0])
    cfg = write_config(tmp_path / "c.yaml", {"controllers": {"actuator": {"store_dir": str(tmp_path / "store"),
        "targets": [{"edge": "e1", "listener": "web", "kind": "haproxy", "socket": str(tmp_path / "no.sock"),
                     "backend": "be", "servers": {"near": "near", "far": "far"}}]}}})
    for command in (["history"], ["rollback", "--dry-run"]):
        r = run_cli("weights", *command, "--edge", "e1", "--config", str(cfg))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-1500:]
        assert f"{store.path} line 2: not a history entry" in lines[0]


@pytest.mark.parametrize("cleared", ['"5"', "1", "0", "null", "[]", '"true"'])
def test_a_fail_static_cleared_that_is_no_boolean_is_damage_named_and_read_as_open(tmp_path: Path,
                                                                                      cleared: str) -> None:
    """``"cleared": "true"`` (a hand edit) read as open without a word: the one field of the file neither named
    nor counted. Now damage like the others (logged naming file and field; ``problem`` set, which the service
    counts), read as open since the file's ``since``: that incident's clear still goes out once decisions are back."""
    store = WeightStore(tmp_path, "e1", "web")
    store.path.parent.mkdir(parents=True)
    store.fail_static_path.write_bytes(b'{"since": 1795400000.0, "cleared": ' + cleared.encode()
                                       + b', "owed": [1795300000.0]}')
    with captured_logs() as logs:
        state = store.fail_static_state()
    assert state is not None and (state.since, state.cleared, state.owed) == (1795400000.0, False, [1795300000.0])
    assert str(store.fail_static_path) in state.problem and "cleared is" in state.problem, state.problem
    assert any("fail_static_state_damaged" in line and "cleared is" in line for line in logs.lines), logs.lines


@pytest.mark.parametrize("doc, cleared", [(b'{"since": 1795400000.0, "cleared": true}', True),
                                          (b'{"since": 1795400000.0, "cleared": false}', False),
                                          (b'{"since": 1795400000.0}', False)])
def test_a_fail_static_cleared_of_true_false_or_none_is_no_damage(tmp_path: Path, doc: bytes, cleared: bool) -> None:
    store = WeightStore(tmp_path, "e1", "web")
    store.path.parent.mkdir(parents=True)
    store.fail_static_path.write_bytes(doc)
    state = store.fail_static_state()
    assert state is not None and state.cleared is cleared and state.problem == ""
