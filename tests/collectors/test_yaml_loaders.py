"""The collectors' own YAML files (IPMI inventory, Keystone probe credentials, iptables port list: a file or
a command's output) are read by the shared reader (opsloop.validation.read_yaml / parse_yaml): an alias
bomb, an alias cycle, a file nested too deeply or not UTF-8 is one line naming the file, never a
traceback or a stall. Before: yaml.safe_load each; an alias bomb of 387 million values stalled the
collector's validation for minutes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from opsloop.collectors.ipmi import Config, InventoryError, build
from opsloop.collectors.iptables.ports import PortsError, parse_ports, read_ports_file
from opsloop.collectors.keystone.credentials import CredentialsError, load

SECRET = "s3cr3t-in-the-file"
BOMB = "l0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))   # 387 million values
BAD: dict[str, tuple[str | bytes, str]] = {
    "an alias bomb": (BOMB, "not usable YAML: its aliases expand to more than 1,000,000 values"),
    "an alias cycle": ("hosts: &h [*h]\n", "not usable YAML: an alias refers to a collection that contains it"),
    "nested too deeply": ("[" * 3000 + "]" * 3000, "not usable YAML: nested too deeply"),
    "not UTF-8": (f"# r\xe9seau\npassword: {SECRET}\xe9\n".encode("latin-1"), "not UTF-8 text"),
}


def _inventory(f: Path) -> None:
    build(Config(inventory=f))


def _credentials(f: Path) -> None:
    load(f, "T_KS_", {})


LOADERS: dict[str, tuple[Callable[[Path], object], type[Exception], str]] = {
    "ipmi inventory": (_inventory, InventoryError, "inventory {f}: "),
    "keystone credentials": (_credentials, CredentialsError, "credentials file {f}: "),
    "iptables ports file": (read_ports_file, PortsError, "ports file {f}: "),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("loader", LOADERS)
def test_a_file_the_reader_refuses_is_one_line_naming_it(loader: str, case: str, tmp_path: Path) -> None:
    fn, error, prefix = LOADERS[loader]
    content, expected = BAD[case]
    f = tmp_path / "file.yaml"
    f.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(error) as e:
        fn(f)
    line = str(e.value)
    assert "\n" not in line and line.startswith(prefix.format(f=f)) and expected in line, line
    assert SECRET not in line


def test_credentials_not_utf8_give_the_offset_not_the_byte(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_bytes(f"password: {SECRET}\xe9\n".encode("latin-1"))
    with pytest.raises(CredentialsError) as e:
        load(f, "T_KS_", {})
    # the offset, not the byte: a byte of a password (the other loaders name it: 0xe9)
    assert str(e.value) == f"credentials file {f}: not UTF-8 text (at byte offset {10 + len(SECRET)})"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [c for c in BAD if c != "not UTF-8"])
def test_a_ports_command_output_the_reader_refuses_is_one_line(case: str) -> None:
    content, expected = BAD[case]
    with pytest.raises(PortsError) as e:
        parse_ports(str(content), "ports_command output")
    assert str(e.value) == f"ports_command output: {expected}"


def test_an_empty_ports_file_is_no_ports(tmp_path: Path) -> None:
    f = tmp_path / "ports.yaml"
    f.write_text("# no ports yet\n")
    assert read_ports_file(f) == []
