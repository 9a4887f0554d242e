"""The paging actuator's Alertmanager config loader uses the shared YAML reader: a file that is not UTF-8,
not YAML, an alias bomb or cycle, or nested too deeply is one line naming it (a ValueError, which
`opsloop page render-config` prints with exit 2), never a traceback or a stall. Before: yaml.safe_load of
read_text(): a UnicodeDecodeError or YAMLError traceback, and an alias bomb expanded by the rendering."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsloop.controllers.paging.amconfig import DEFAULT_SOURCE, load_alertmanager_config, render_alertmanager_config

BOMB = "route: {receiver: x}\nreceivers: []\nl0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
CASES: dict[str, tuple[str | bytes, str]] = {
    "an alias bomb": (BOMB, "not usable YAML: its aliases expand to more than 1,000,000 values"),
    "an alias cycle": ("route: &r {routes: [*r]}\nreceivers: []\n",
                       "not usable YAML: an alias refers to a collection that contains it"),
    "not UTF-8": ("# r\xe9seau\nroute: {receiver: x}\nreceivers: []\n".encode("latin-1"),
                  "not UTF-8 text (byte 0xe9 at offset 3)"),
    "not YAML": ("route: [\n", "not valid YAML: line 2, column 1"),
    "nested too deeply": ("[" * 3000 + "]" * 3000, "not usable YAML: nested too deeply"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES)
def test_a_bad_alertmanager_config_is_one_line_naming_it(case: str, tmp_path: Path) -> None:
    content, expected = CASES[case]
    f = tmp_path / "alertmanager.yml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as e:
        render_alertmanager_config(webhook_url="http://127.0.0.1:1", routing_key_file="/k", source=f)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{f}: ") and expected in line, line


def test_the_shipped_config_still_loads() -> None:
    assert {"route", "receivers"} <= set(load_alertmanager_config(DEFAULT_SOURCE))
