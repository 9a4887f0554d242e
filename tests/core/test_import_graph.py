"""The import graph follows the data flow (docs/design.md): the core (`opsloop/`) imports no stage; a stage
(`collectors/`, `streams/`, `controllers/`) imports the core and itself, never a sibling; the lab (`lab/`)
sits above them all and nothing imports it. No module imports another inside a function (such an import
hides an arrow or a cycle from the reader), and the module-level graph has no cycle.

The walk reads the source (ast), so it sees every import whether or not it runs. A module found by name at
run time (the CLI's ``module:function`` strings, collector plugins looked up by folder) is a registry entry,
not an import, and is not an arrow here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO

# folder -> package it installs as (setup.py's mapping)
FOLDERS = {"opsloop": "opsloop", "collectors": "opsloop.collectors", "streams": "opsloop.streams",
           "controllers": "opsloop.controllers", "lab": "opsloop.lab"}
STAGES = ("collectors", "streams", "controllers")
# what each layer may import besides itself and the core
ALLOWED = {"core": set(), "collectors": set(), "streams": set(), "controllers": set(),
           "lab": {"collectors", "streams", "controllers"}}


@dataclass(frozen=True)
class Import:
    source: str        # importing module
    target: str        # imported module (or module.name)
    line: int
    in_function: bool


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "opsloop":
        return None
    if len(parts) > 1 and parts[1] in (*STAGES, "lab"):
        return parts[1]
    return "core"


def modules(root: Path = REPO) -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            if "testdata" in rel.parts:
                continue
            name = ".".join([package, *rel.parts])
            out[name.removesuffix(".__init__")] = path
    return out


def imports_of(module: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                found.append(Import(module, base, child.lineno, in_function))
                found.extend(Import(module, f"{base}.{a.name}", child.lineno, in_function) for a in child.names)
            visit(child, inside)

    visit(tree, False)
    return [i for i in found if i.target.split(".")[0] == "opsloop"]


def graph(root: Path = REPO) -> tuple[dict[str, Path], list[Import]]:
    mods = modules(root)
    return mods, [imp for name, path in mods.items() for imp in imports_of(name, path)]


def layer_violations(imps: list[Import]) -> list[str]:
    out = []
    for imp in imps:
        src, dst = layer(imp.source), layer(imp.target)
        if src is None or dst is None or dst in (src, "core"):
            continue
        if dst not in ALLOWED[src]:
            out.append(f"{imp.source}:{imp.line} ({src}) imports {imp.target} ({dst})")
    return out


def function_level(imps: list[Import]) -> list[str]:
    return sorted({f"{i.source}:{i.line} imports {i.target} inside a function" for i in imps if i.in_function})


def cycles(mods: dict[str, Path], imps: list[Import]) -> list[list[str]]:
    """Strongly connected components (size > 1) of the module-level graph. Importing ``a.b.c`` runs
    ``a/__init__`` and ``a/b/__init__`` first, so an edge to a module is an edge to its packages too."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for imp in imps:
        if imp.in_function:
            continue
        parts = imp.target.split(".")
        for n in range(1, len(parts) + 1):
            target = ".".join(parts[:n])
            if target in mods and target != imp.source and not imp.source.startswith(target + "."):
                edges[imp.source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strongconnect(v: str) -> None:   # Tarjan, iterative enough for this tree's depth
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return out


@pytest.fixture(scope="module")
def tree() -> tuple[dict[str, Path], list[Import]]:
    mods, imps = graph()
    assert len(mods) > 150 and len(imps) > 500   # the walk found the tree
    return mods, imps


def test_no_arrow_from_the_core_to_a_stage_or_between_stages_or_into_the_lab(tree) -> None:
    assert layer_violations(tree[1]) == []


def test_no_import_inside_a_function(tree) -> None:
    assert function_level(tree[1]) == []


def test_no_import_cycle(tree) -> None:
    assert cycles(*tree) == []


def test_the_walk_sees_what_it_must_refuse(tmp_path: Path) -> None:
    """The checks on a small tree with one of each fault, so a test above cannot pass by seeing nothing."""
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "opsloop" / "core_mod.py").write_text("from opsloop.streams import agents\n")
    (tmp_path / "streams" / "agents.py").write_text("import opsloop.core_mod\n")
    (tmp_path / "controllers" / "act.py").write_text(
        "from opsloop.collectors.lvs import parse\n"
        "def f():\n    from opsloop.lab import pipeline\n")
    (tmp_path / "lab" / "pipeline.py").write_text("from opsloop.streams import agents\nfrom . import core\n")
    mods, imps = graph(tmp_path)
    assert layer_violations(imps) == [
        "opsloop.core_mod:1 (core) imports opsloop.streams (streams)",
        "opsloop.core_mod:1 (core) imports opsloop.streams.agents (streams)",
        "opsloop.controllers.act:1 (controllers) imports opsloop.collectors.lvs (collectors)",
        "opsloop.controllers.act:1 (controllers) imports opsloop.collectors.lvs.parse (collectors)",
        "opsloop.controllers.act:3 (controllers) imports opsloop.lab (lab)",
        "opsloop.controllers.act:3 (controllers) imports opsloop.lab.pipeline (lab)",
    ]
    assert function_level(imps) == [
        "opsloop.controllers.act:3 imports opsloop.lab inside a function",
        "opsloop.controllers.act:3 imports opsloop.lab.pipeline inside a function"]
    assert cycles(mods, imps) == [["opsloop.core_mod", "opsloop.streams.agents"]]
    # a relative import resolves against the package: lab/pipeline.py's "from . import core" is opsloop.lab.core
    assert any(i.target == "opsloop.lab.core" for i in imps if i.source == "opsloop.lab.pipeline")
