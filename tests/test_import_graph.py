"""flashtree's import graph: no cycles (imports inside functions count), and sglang only under flashtree/patches/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "flashtree"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `name` imports (module level and inside functions), relative imports resolved; a `from X import
    y` names X.y where that is a module, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports(name, path, known) if m in known and m != name} for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(edges):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges[nxt])))
    return None


def test_the_finder_sees_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    edges = {
        "pkg.a": imports("pkg.a", pkg / "a.py", known) & known,
        "pkg.b": imports("pkg.b", pkg / "b.py", known) & known,
        "pkg": set(),
    }
    assert edges == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg": set()}
    assert find_cycle(edges) == ["pkg.a", "pkg.b", "pkg.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_flashtree_has_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_sglang_is_imported_only_under_patches():
    outside = []
    for name, path in modules().items():
        if name.startswith("flashtree.patches"):
            continue
        used = {m for m in imports(name, path, set()) if m == "sglang" or m.startswith("sglang.")}
        if used:
            outside.append(f"{name}: {sorted(used)}")
    assert not outside, "sglang imported outside flashtree/patches/: " + "; ".join(outside)


def test_release_adapters_are_leaves():
    """The adapters answer the release ABI: of flashtree they import only each other, the step's data types and the
    toggles' error type, never a feature module (the step, the plan, a feature's file)."""
    allowed = {"flashtree.patches.step_types", "flashtree.patches.toggles"}
    edges = graph()
    reach = {
        name: sorted(m for m in deps if not m.startswith("flashtree.patches.adapters") and m not in allowed)
        for name, deps in edges.items()
        if name.startswith("flashtree.patches.adapters")
    }
    assert not any(reach.values()), {k: v for k, v in reach.items() if v}
