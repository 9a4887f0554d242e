"""The tests mirror the source tree: each test package under tests/ is named after the folder whose code it
tests (tests/core for the core package opsloop/), so a module's tests are found where the module is.
The suites of a kind that span every stage (e2e, faults, scale) are the exception, kept as they are."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST
from tests.helpers import REPO

SUITES_OF_A_KIND = ("e2e", "faults", "scale")
# the first folder under tests/ -> the source folder it mirrors
ROOTS = {"core": "opsloop"}


def source_folder(test_package: Path, tests: Path = REPO / "tests") -> Path:
    first, *rest = test_package.relative_to(tests).parts
    return REPO / ROOTS.get(first, first) / Path(*rest)


def mirrored_packages() -> list[Path]:
    tests = REPO / "tests"
    return sorted(p.parent for p in tests.rglob("__init__.py")
                  if p.parent != tests and "__pycache__" not in p.parts
                  and p.parent.relative_to(tests).parts[0] not in SUITES_OF_A_KIND)


def test_every_test_package_mirrors_a_source_folder() -> None:
    packages = mirrored_packages()
    assert len(packages) > 15   # the walk found the tree
    assert [str(p.relative_to(REPO)) for p in packages if not source_folder(p).is_dir()] == []


def test_the_mapping_refuses_a_folder_without_a_source() -> None:
    assert source_folder(REPO / "tests" / "core" / "audit") == REPO / "opsloop" / "audit"
    assert source_folder(REPO / "tests" / "controllers" / "edge" / "service") == \
        REPO / "controllers" / "edge" / "service"
    assert not source_folder(REPO / "tests" / "observability").is_dir()


def test_the_files_handed_out_first_exist() -> None:
    # a renamed file would silently fall back to collection order and end a parallel run on it
    assert LONGEST_FIRST and [p for p in LONGEST_FIRST if not (REPO / p).is_file()] == []
