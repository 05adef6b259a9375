"""The picture stays without circles: entry points (cli, run) above tasks above models above
parts (attention, norm, activation, position, ffn, stacks ...) above the shared types (core)
and the registry; data and results beside,
never importing models; the schema (declarations, checked before torch) imports none of them;
a variant never imports a task, a dataset or the results package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "xformer_bench"
PARTS = ("attention", "norm", "activation", "position", "ffn", "stacks", "embedding", "heads")
ABOVE_PARTS = ("models", "tasks", "data", "results", "training", "run", "cli")
FORBIDDEN = {
    "core": (*PARTS, *ABOVE_PARTS),
    **{part: ABOVE_PARTS for part in PARTS},
    "models": ("tasks", "data", "results", "training", "run", "cli"),
    "tasks": ("data", "results", "run", "cli"),
    "data": ("models", "tasks", "results", "run", "cli", *PARTS),
    "results": ("models", "tasks", "data", "training", "run", "cli", *PARTS),
    "schema": (*PARTS, *ABOVE_PARTS),  # checked before torch is imported: declarations only
}
"""Package -> the xbench packages it may not import, at any depth of its code."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool, annotations: bool = True) -> set[str]:
    """xbench modules ``path`` imports; top level only: what runs when it is imported (not
    inside functions, not under ``if TYPE_CHECKING``); without annotations: none under
    ``if TYPE_CHECKING`` (names only for type hints)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (top_level_only or not annotations) and isinstance(child, ast.If) \
                    and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.update(f"{child.module}.{a.name}" for a in child.names)
                found.add(child.module)
            visit(child)

    visit(tree)
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    return {name for name in found if name in modules and name.startswith("xformer_bench")}


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: module_name(p))
def test_a_package_imports_only_what_lies_below_or_beside_it(path):
    package = module_name(path).split(".")[1] if "." in module_name(path) else ""
    banned = FORBIDDEN.get(package, ())
    # core may name a part's interface in a type hint (ForwardContext.position: Position)
    bad = sorted(m for m in imports(path, top_level_only=False, annotations=package != "core")
                 if m.split(".")[1] in banned)
    assert not bad, f"{module_name(path)} imports {bad}"


def test_no_import_cycle_between_modules():
    graph = {module_name(p): imports(p, top_level_only=True) for p in SOURCES}
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                raise AssertionError(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
