"""opsloop.validation.read_yaml, the one reader of the YAML files a user hands a command (config, topology,
scenario): every way a file cannot be used is a YamlFileError of one line, never another exception, and
nothing of the file's text is in it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opsloop.validation import YamlFileError, read_yaml
from tests.helpers import write_case_file

SECRET = "s3cr3t-in-the-file"


@pytest.mark.parametrize(("content", "expected"), [
    (None, "cannot read (No such file or directory)"),
    ("dir", "cannot read (Is a directory)"),
    (f'a: "{SECRET}\nb: 1\n', "not valid YAML: line "),
    (f"# r\xe9seau {SECRET}\na: 1\n".encode("latin-1"), "not UTF-8 text (byte 0xe9 at offset 3)"),
    ("\ufeffa: 1\n".encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
    (f"a: \x00{SECRET}\n", "not valid YAML: "),
    ("[" * 2000 + "]" * 2000, "nested too deeply"),   # was a RecursionError traceback
    # aliases of aliases: 9 levels of 9 are 387 million values; validating them stalled every command
    ("l0: &l0 [a, a, a, a, a, a, a, a, a]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9)),
     "not usable YAML: its aliases expand to more than 1,000,000 values"),
    ("targets: &t [*t]\n", "not usable YAML: an alias refers to a collection that contains it"),
], ids=["missing", "a directory", "unclosed quote", "latin-1", "utf-16", "a NUL", "nested too deeply",
        "an alias bomb", "an alias cycle"])
def test_a_file_that_cannot_be_used_is_one_line(content: str | bytes | None, expected: str, tmp_path: Path) -> None:
    f = write_case_file(tmp_path / "f.yaml", content)
    with pytest.raises(YamlFileError) as e:
        read_yaml(f)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert SECRET not in str(e.value)


def test_the_line_and_column_of_a_syntax_error_are_named(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("a: 1\nb: [1, 2\nc: 3\n")
    with pytest.raises(YamlFileError, match=r"^not valid YAML: line 3, column 2: .*from line 2, column 4"):
        read_yaml(f)


def test_a_good_file_is_its_document(tmp_path: Path) -> None:
    f = tmp_path / "f.yaml"
    f.write_text("a: &x [1, 2]\nb: {c: x}\nd: [*x, *x]\n")   # aliases used as meant: fine
    assert read_yaml(f) == {"a": [1, 2], "b": {"c": "x"}, "d": [[1, 2], [1, 2]]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=300),
                      st.text(alphabet=st.sampled_from("ab:- \n\t[]{}'\"&*!|>%@`#,?\x00\xe9"), max_size=300)
                      .map(lambda t: t.encode())))
def test_any_bytes_are_a_document_or_one_line(data: bytes, tmp_path: Path) -> None:
    f = tmp_path / "fuzz.yaml"
    f.write_bytes(data)
    try:
        read_yaml(f)
    except YamlFileError as e:
        assert "\n" not in str(e) and str(e), repr(str(e))


def test_an_endless_file_is_refused_not_read_until_memory_runs_out() -> None:
    with pytest.raises(YamlFileError, match=r"^larger than 16 MiB: not a file of settings$"):
        read_yaml(Path("/dev/zero"))


def test_a_long_tag_is_not_quoted_whole(tmp_path: Path) -> None:
    # PyYAML's problem quotes the tag it has no constructor for: a 100 kB tag was a 100 kB error line
    f = tmp_path / "f.yaml"
    f.write_text("a: !" + "x" * 100_000 + " 1\n")
    with pytest.raises(YamlFileError, match=r"^not valid YAML: line 1, column 4: could not determine a constructor") as e:
        read_yaml(f)
    assert len(str(e.value)) < 300, len(str(e.value))
