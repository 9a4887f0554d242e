"""The lab sits above the stages it drives: neither the core (`opsloop/`) nor a stage (`collectors/`,
`streams/`, `controllers/`) imports it, at module level or inside a function. The CLI reaches the lab's
commands only through its ``module:function`` strings, which are not imports."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

BELOW_THE_LAB = ("opsloop", "collectors", "streams", "controllers")


def lab_imports(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names
                  if n == "opsloop.lab" or n.startswith("opsloop.lab.")]
    return found


def test_neither_the_core_nor_a_stage_imports_the_lab() -> None:
    files = [p for top in BELOW_THE_LAB for p in sorted((REPO / top).rglob("*.py"))]
    assert len(files) > 50  # the walk found the tree
    assert [hit for f in files for hit in lab_imports(f)] == []


def test_the_walk_sees_every_form_of_import_also_inside_a_function(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from opsloop import lab\n"
                     "def f():\n    from opsloop.lab.pipeline import main\n    import opsloop.lab.edge\n"
                     "import opsloop.laboratory\n")  # another name that merely starts alike
    assert [h.split(" ")[1] for h in lab_imports(probe, tmp_path)] == [
        "opsloop.lab", "opsloop.lab.pipeline", "opsloop.lab.pipeline.main", "opsloop.lab.edge"]
