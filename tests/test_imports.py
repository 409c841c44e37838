"""The package's import graph has no cycle.

Every `bebop/**/*.py` is parsed with `ast` (nothing is imported). Each `import bebop.x`,
`from bebop.x import y` and relative import is an edge from the importing module, wherever the
statement sits (module level, inside a function, under `if TYPE_CHECKING:`). `from bebop.a import b`
where `b` is a submodule is an edge to `bebop.a.b`; any other name imported from `bebop.a` is an edge
to the package's `__init__`, the module `bebop.a`. (As in grimp / import-linter, importing `bebop.a.b`
is not counted as an edge to `bebop.a`, although Python runs that `__init__` first.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "bebop"


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package (`a/__init__.py` is `a`)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from {'.' * level}{target} import ...` written in `module`."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The package modules that `module` imports anywhere in its file (function bodies included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module or "")
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        else:
            continue
        targets.update(name for name in names if name in modules)
    targets.discard(module)
    return targets


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    files = module_files(root, package)
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None. Iterative DFS with white/grey/black colouring."""
    colour = {node: 0 for node in graph}  # 0 unvisited, 1 on the current path, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        colour[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour.get(child, 2) == 1:
                return path[path.index(child):] + [child]
            elif colour.get(child, 2) == 0:
                colour[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def test_graph_sees_function_local_and_submodule_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "b.py").write_text("def f():\n    from bebop import c\n")
    (pkg / "c.py").write_text("from .a import b\n")
    graph = import_graph(tmp_path)
    assert graph["bebop.a.b"] == {"bebop.c"}
    assert graph["bebop.c"] == {"bebop.a.b"}
    assert find_cycle(graph) in (["bebop.a.b", "bebop.c", "bebop.a.b"], ["bebop.c", "bebop.a.b", "bebop.c"])


def test_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20 and any(graph.values())  # the walk found the package and its imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
