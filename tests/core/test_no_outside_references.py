"""No file of the repository cites what a reader of the repository does not have: documents outside it,
issue or work-item numbers, or the source documents by their old internal numbers ("seed 000") instead of
their titles (docs/sources.md). Random-number seeds are fine and not matched."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import REPO

FORBIDDEN = {
    "a design document outside the repository": re.compile(r"\b(?:DESIGN|COMPONENTS)\.md\b"),
    "a shared folder outside the repository": re.compile(r"\.\./shared\b|/work/shared\b"),
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "a work item": re.compile(r"\bitems? \d+\b", re.I),
    "a source document by number": re.compile(r"\bseeds? 0\d\d\b", re.I),
    "a source document as 'the seed'": re.compile(
        r"\bthe seeds?'?s?\b|\bseeds' (?:numbers|figures|scenarios|regression|table|assumptions)", re.I),
}
# The guards themselves quote what they forbid; benchmark results are a record of past runs.
EXEMPT = {"tests/core/test_no_outside_references.py", "tests/core/test_cli_help.py"}
EXEMPT_DIRS = ("bench/results/",)


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    return [n for n in names if n not in EXEMPT and not n.startswith(EXEMPT_DIRS) and (REPO / n).is_file()]


def hits(text: str) -> list[tuple[str, str]]:
    return [(what, m.group(0)) for what, pattern in FORBIDDEN.items() for m in pattern.finditer(text)]


def test_no_file_cites_what_is_not_in_the_repository() -> None:
    found = []
    for name in tracked_text_files():
        raw = (REPO / name).read_bytes()
        if b"\0" in raw[:4096]:
            continue  # binary
        for lineno, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
            found += [f"{name}:{lineno}: {what}: {text!r}" for what, text in hits(line)]
    assert not found, "\n".join(found)


def test_the_patterns_catch_what_they_should_and_spare_random_seeds() -> None:
    for text in ("see DESIGN.md §4", "COMPONENTS.md", "../shared/notes", "(issue 7)", "issue #12", "item 3",
                 "Seed 000: three generations", "seeds 001/004", "the seed's damping", "the seeds' numbers"):
        assert hits(text), text
    for text in ("seed: 29", "random.Random(seed)", "fixed-seed corpus", "reporting seeds 201-206", "the tuning seeds' +0.9",
                 "another noise seed", "seed_state()", "np.random.default_rng(scn.seed)"):
        assert not hits(text), text
