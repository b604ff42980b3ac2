"""The engine's folders stay layered (README.md, "Development"): no two packages import each other,
directly or around a loop, and a module imports the engine's modules at its top, except where
laziness is the point: the CLI (`tandem --help` answers without loading pandas or numba), the probe
(it runs inside the watched interpreter, which may lack tandem's dependencies) and the demo's
service program (its OpenTelemetry exporter is optional). Elsewhere an import inside a function says
why on its line (`# lazy: ...`): a light path (`tandem record` starting its command) that would
otherwise load numba."""
from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine"
LAZY_ALLOWED = ("commands", "probe", "demo")
# README.md's folder table, top to bottom: a package imports only from rows above its own.
LAYERS = [{"errors"}, {"jvm"}, {"probe"}, {"clock"}, {"facts"}, {"session"}, {"ring", "store"}, {"join"}, {"correlate"}, {"ingest"},
          {"results"}, {"memory", "spans"}, {"report"}, {"analysis"}, {"record"}, {"live", "fleet"}, {"commands", "demo"}]


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _engine_imports(tree: ast.AST):
    """(import node, engine module it names, inside a function?) of every import of the engine."""
    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.split(".")[0] == "engine":
                names = [child.module] if child.module != "engine" else [f"engine.{a.name}" for a in child.names]
                for name in names:
                    yield child, name, in_function
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "engine":
                        yield child, alias.name, in_function
            yield from walk(child, inside)
    yield from walk(tree, False)


def _modules():
    for path in sorted(ENGINE.rglob("*.py")):
        relative = path.relative_to(ENGINE.parent)
        package = relative.parts[1] if len(relative.parts) > 2 else relative.stem
        text = path.read_text()
        yield path, package, ast.parse(text, str(path)), text.splitlines()


def test_no_two_packages_import_each_other():
    edges: dict[str, set[str]] = {}
    for _path, package, tree, _lines in _modules():
        for _node, name, _lazy in _engine_imports(tree):
            target = _package(name)
            if target and target != package:
                edges.setdefault(package, set()).add(target)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    loops = sorted(f"{a} -> {b} -> ... -> {a}" for a, targets in edges.items() for b in targets if reaches(b, a))
    assert not loops, "package import loops:\n" + "\n".join(loops)


def test_each_package_imports_only_from_the_layers_above_it():
    layer = {package: i for i, packages in enumerate(LAYERS) for package in packages}
    upward = sorted({f"{path.relative_to(ENGINE.parent)}:{node.lineno} ({package}) imports {name}"
                     for path, package, tree, _lines in _modules() if package in layer
                     for node, name, _lazy in _engine_imports(tree)
                     if _package(name) in layer and _package(name) != package and layer[_package(name)] >= layer[package]})
    unplaced = sorted({package for _path, package, _tree, _lines in _modules()} - set(layer) - {"__init__", "__main__"})
    assert not unplaced, f"packages missing from LAYERS (and README.md's folder table): {unplaced}"
    assert not upward, "imports from a layer not above:\n" + "\n".join(upward)


def test_engine_modules_are_imported_at_the_top_of_modules():
    lazy = [f"{path.relative_to(ENGINE.parent)}:{node.lineno} imports {name} inside a function"
            for path, package, tree, lines in _modules() if package not in LAZY_ALLOWED
            for node, name, in_function in _engine_imports(tree)
            if in_function and "# lazy:" not in lines[node.lineno - 1]]
    assert not lazy, "\n".join(lazy)
