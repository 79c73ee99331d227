"""The package's folders are its layers (docs/architecture.md): no module imports from a
layer above its own, and no modules import each other round a circle.

Every module under splitwise_jax/ is parsed with `ast` (nothing is imported); every
import statement counts, the ones inside functions too. A module's layer is its
folder's, except at the edge: the command lines (`cli/`, the entry modules `evaluate`
and `predict`, every `cli.py` and `__main__.py`) and the packages' public faces (each
`__init__.py` of the package and of calibrate/optimize/simulate, which re-export their
members and their command line's `main`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "splitwise_jax"

#: Layers, lowest first. A module may import its own layer and those below it.
LAYERS = (
    "core",      # top-level private utilities: _smooth, _validate, _paths, _exported, _array_cache
    "specs",     # specs/
    "phases",    # phases/
    "cluster",   # cluster/
    "io",        # io/
    "analysis",  # top-level uncertainty, sweep
    "models",    # calibrate/, optimize/
    "simulate",  # simulate/ (simulate.candidates checks optimize's answers)
    "edge",      # command lines and public faces
)
RANK = {name: i for i, name in enumerate(LAYERS)}

FOLDER_LAYER = {"specs": "specs", "phases": "phases", "cluster": "cluster", "io": "io", "cli": "edge",
                "calibrate": "models", "optimize": "models", "simulate": "simulate"}
TOP_LAYER = {"_smooth": "core", "_validate": "core", "_paths": "core", "_exported": "core", "_tables": "core",
             "_roots": "core", "_batching": "core", "_array_cache": "core",
             "uncertainty": "analysis", "sweep": "analysis", "evaluate": "edge", "predict": "edge"}
#: Packages whose __init__ is a public face (re-exports across the package, and `main`).
FACES = {"splitwise_jax", "splitwise_jax.calibrate", "splitwise_jax.optimize", "splitwise_jax.simulate"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of a module (dotted name); KeyError for one that fits no layer."""
    parts = module.split(".")[1:]
    if module in FACES or (parts and parts[-1] in ("cli", "__main__")):
        return "edge"
    if len(parts) == 1 and parts[0] not in FOLDER_LAYER:
        return TOP_LAYER[parts[0]]
    return FOLDER_LAYER[parts[0]]


def imports_of(module: str, path: Path, modules) -> set[str]:
    """The package's modules that `module` imports (a `from pkg import name` counts as
    an import of the submodule pkg.name when that is a module, else of pkg)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("splitwise_jax"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("splitwise_jax"))
    out.discard(module)
    unknown = out - set(modules)
    assert not unknown, f"{module} imports {sorted(unknown)}, which are not modules of the package"
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def upward_imports(graph) -> list[str]:
    return [f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})"
            for m, targets in sorted(graph.items()) for t in sorted(targets)
            if RANK[layer_of(t)] > RANK[layer_of(m)]]


def cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), and self-loops."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    unplaced = []
    for m in _modules():
        try:
            layer_of(m)
        except KeyError:
            unplaced.append(m)
    assert not unplaced, f"modules in no layer (place them in a layer folder, or add them to this test): {unplaced}"


def test_no_import_from_a_higher_layer():
    bad = upward_imports(import_graph())
    assert not bad, "imports from a higher layer (docs/architecture.md):\n" + "\n".join(bad)


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, f"modules that import each other round a circle: {found}"


def test_the_checks_catch_what_they_are_for():
    graph = import_graph()
    up = {m: set(t) for m, t in graph.items()}
    up["splitwise_jax.specs.hardware"].add("splitwise_jax.cluster.cluster")
    assert upward_imports(up) == ["splitwise_jax.specs.hardware (specs) imports splitwise_jax.cluster.cluster (cluster)"]
    loop = {m: set(t) for m, t in graph.items()}
    # flows_baseline imports types directly, and nothing types could reach otherwise (chunked,
    # which imports flows_baseline since Chunked.simulated runs as a Baseline, would join
    # the circle through it): the planted circle is these two modules exactly.
    loop["splitwise_jax.cluster.types"].add("splitwise_jax.cluster.flows_baseline")
    assert ["splitwise_jax.cluster.flows_baseline", "splitwise_jax.cluster.types"] in cycles(loop)


@pytest.mark.parametrize("module, layer", [
    ("splitwise_jax._smooth", "core"), ("splitwise_jax.specs.llm", "specs"), ("splitwise_jax.phases.params", "phases"),
    ("splitwise_jax.cluster.cluster", "cluster"), ("splitwise_jax.io.design_file", "io"),
    ("splitwise_jax.uncertainty", "analysis"), ("splitwise_jax.calibrate.fit", "models"),
    ("splitwise_jax.simulate.engine", "simulate"), ("splitwise_jax.optimize.cli", "edge"),
    ("splitwise_jax.evaluate", "edge"), ("splitwise_jax.cli._cli", "edge"), ("splitwise_jax", "edge"),
])
def test_layer_of(module, layer):
    assert layer_of(module) == layer
