"""The package's import graph has no cycle, and no import runs up its floors (``LAYERS``).

Every `bebop/**/*.py` is parsed with `ast` (nothing is imported). Each `import bebop.x`,
`from bebop.x import y` and relative import is an edge from the importing module, wherever the
statement sits (module level, inside a function, under `if TYPE_CHECKING:`). `from bebop.a import b`
where `b` is a submodule is an edge to `bebop.a.b`; any other name imported from `bebop.a` is an edge
to the package's `__init__`, the module `bebop.a`. (As in grimp / import-linter, importing `bebop.a.b`
is not counted as an edge to `bebop.a`, although Python runs that `__init__` first.)

Floors, lowest first (``LAYERS``): utils < config, task < architectures, losses, speculative (the core:
verification and the engine) < pretrained, speculative.auto (the chooser wing) < mtp (the head drafts for
the engine) < embedded, rollout < models < the wings: analysis, check, integrations, rl < demo, options,
command_inputs < commands < cli < __main__. A module imports only from its own unit or from a lower floor;
units on one floor do not import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "bebop"
LAYERS = (  # floors of units (a package below bebop, or a top-level module), lowest first
    ("bebop", "utils"),  # the version; files, locks, errors, devices: nothing of Bebop's own
    ("config", "task"),  # settings and their checks; the embedded task
    ("architectures", "losses", "speculative"),  # model families; draft objectives; verification and the engine
    ("pretrained", "speculative.auto"),  # loading a user's checkpoint; the auto chooser of (mode, K)
    ("mtp",),  # the MTP head: drafts for the engine, trained with the losses
    ("embedded", "rollout"),  # the tiny default model; rollout backends over the engine and vLLM
    ("models",),  # a user's model or the embedded one
    ("analysis", "check", "integrations", "rl"),  # the wings
    ("demo", "options", "command_inputs"),  # the demo's pipeline; the settings of each command; what commands read
    ("commands",),  # one function per subcommand
    ("cli",),  # argument parsing
    ("__main__",),  # python -m bebop
)


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


def fake_package(root: Path, sources: dict[str, str]) -> Path:
    """Writes ``root/bebop``: each path below it (``a/__init__.py``...) with its source; returns ``root``."""
    for name, source in sources.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def test_graph_sees_function_local_and_submodule_imports(tmp_path):
    graph = import_graph(fake_package(tmp_path, {"__init__.py": "", "a/__init__.py": "",
                                                 "a/b.py": "def f():\n    from bebop import c\n",
                                                 "c.py": "from .a import b\n"}))
    assert graph["bebop.a.b"] == {"bebop.c"}
    assert graph["bebop.c"] == {"bebop.a.b"}
    assert find_cycle(graph) in (["bebop.a.b", "bebop.c", "bebop.a.b"], ["bebop.c", "bebop.a.b", "bebop.c"])


def test_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20 and any(graph.values())  # the walk found the package and its imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def unit_of(module: str) -> str:
    """The unit a module belongs to: ``bebop.rl.loop`` -> ``rl``, ``bebop.speculative.auto.profile`` ->
    ``speculative.auto``, ``bebop.cli`` -> ``cli``, ``bebop`` -> ``bebop``."""
    parts = module.split(".")[1:]
    if parts[:2] == ["speculative", "auto"]:
        return "speculative.auto"
    return parts[0] if parts else PACKAGE


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import from a unit into a higher floor, or into another unit of its own floor."""
    floor = {unit: n for n, units in enumerate(layers) for unit in units}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b and floor[b] >= floor[a]:
                bad.append(f"{module} ({a}, floor {floor[a]}) imports {target} ({b}, floor {floor[b]})")
    return bad


def test_every_unit_has_a_floor():
    units = {unit_of(module) for module in module_files()}
    floors = [unit for layer in LAYERS for unit in layer]
    assert len(floors) == len(set(floors))
    assert units == set(floors), f"without a floor: {sorted(units - set(floors))}; gone: {sorted(set(floors) - units)}"


def test_upward_imports_are_found(tmp_path):
    root = fake_package(tmp_path, {"__init__.py": "", "utils/__init__.py": "",
                                   "utils/files.py": "def f():\n    from bebop.rl import loop\n",
                                   "rl.py": "from bebop.utils import files\n"})
    bad = upward_imports(import_graph(root), layers=(("utils",), ("rl",)))
    assert bad == ["bebop.utils.files (utils, floor 0) imports bebop.rl (rl, floor 1)"]


def test_utils_import_nothing_of_bebop_outside_utils():
    graph = import_graph()
    outside = {f"{module} -> {target}" for module, targets in graph.items() if unit_of(module) == "utils"
               for target in targets if unit_of(target) != "utils"}
    assert any(unit_of(module) == "utils" for module in graph)
    assert not outside, sorted(outside)


def test_no_import_runs_up_the_floors():
    bad = upward_imports(import_graph())
    assert not bad, "imports running up the floors:\n" + "\n".join(bad)
