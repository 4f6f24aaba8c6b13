"""The import contract: every import in src/lmrl points to its own layer or a lower one, no modules
import each other round a circle, no private name crosses a layer, and algos/ (pure tensor functions)
reaches no network, process or stage above it. Imports at module level and inside functions both
count (docs/architecture.md, "Layers")."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# Lowest first. A layer is a package under lmrl/ or a top-level module; the package `lmrl` itself
# (its lazy facade) sits with the API at the top.
ORDER = ["errors", "types", "stats", "registry", "presets", "recipe_files", "config", "pipeline_config", "algos", "models",
         "engines", "serve_queue", "serve", "rewards", "envs", "data", "inputs", "dist", "learners", "trackers",
         "validation", "loading", "task_files", "eval", "loops", "api", "lmrl", "cli"]

ALGOS_FORBIDDEN = ("requests", "httpx", "urllib", "http", "socket", "subprocess", "aiohttp", "openai",
                   "lmrl.rewards", "lmrl.learners", "lmrl.loops", "lmrl.engines", "lmrl.envs")


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module under src/lmrl: dotted name -> (file, is a package __init__)."""
    found = {}
    for path in sorted((SRC / "lmrl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imported_names(path: Path, package: str) -> list[str]:
    """Every dotted name a file imports, anywhere in it; `from a import b` yields a.b (module b, or name b of a)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """Module -> the lmrl modules it imports; module -> every name it imports (lmrl or not)."""
    mods = modules()

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph, raw = {}, {}
    for name, (path, is_package) in mods.items():
        raw[name] = imported_names(path, name if is_package else name.rpartition(".")[0])
        graph[name] = {owner(n) for n in raw[name] if n.split(".")[0] == "lmrl"} - {name, ""}
    return graph, raw


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_every_layer_is_in_the_order():
    graph, _ = import_graph()
    assert {layer(m) for m in graph} == set(ORDER)


def test_imports_point_down_the_order():
    graph, _ = import_graph()
    breaks = {(m, t) for m, targets in graph.items() for t in targets
              if ORDER.index(layer(t)) > ORDER.index(layer(m))}
    assert breaks == set(), f"imports up the order (importer, imported): {sorted(breaks)}"


def test_no_import_cycles():
    graph, _ = import_graph()
    assert cycles(graph) == []


def test_algos_reach_no_io_and_no_stage_above():
    _, raw = import_graph()
    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    bad = {(m, n) for m, names in raw.items() if layer(m) == "algos" for n in names
           if any(under(n, f) for f in ALGOS_FORBIDDEN)}
    assert bad == set()


def test_no_private_name_crosses_a_layer():
    graph, raw = import_graph()
    crossing = {(m, n) for m, names in raw.items() for n in names
                if n.split(".")[0] == "lmrl" and n.rpartition(".")[2].startswith("_")
                and not n.rpartition(".")[2].startswith("__") and layer(n) != layer(m)}
    assert crossing == set()


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imported_names_reads_relative_and_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os.path\nfrom .b import c\n\n\ndef f():\n    from .. import d\n    from lmrl.x import y\n")
    assert imported_names(path, "lmrl.pkg") == ["os.path", "lmrl.pkg.b.c", "lmrl.d", "lmrl.x.y"]
