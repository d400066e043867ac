"""Ember's layer map, declared once, and the import graph of ``core/ember`` it is held to.

A module sits in one band; it may import its own band and the bands below it, never one
above (settings flow down, requests flow in from the top). A few rules say more than the
order does. ``tests/unit/test_layers.py`` fails on every cycle and every forbidden arrow;
``python -m tests.unit.layer_map`` prints them (the counts a change note quotes).

The graph counts every import a module runs, lazy (function-level) ones included: a lazy
import still ties the two modules together, it only hides the cycle from the interpreter.
Imports under ``if TYPE_CHECKING:`` never run and do not count.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

CORE = Path(__file__).resolve().parents[2] / "core"

# The bands, lowest first: (name, what belongs there, module prefixes). A module belongs to
# the band of its longest matching prefix ("ember" alone is the package's own __init__).
BANDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "ground",
        "value types, errors, capabilities and leaf helpers that import nothing of Ember's "
        "above them",
        (
            "ember",
            "ember.errors",
            "ember.capabilities",
            "ember.defaults",
            "ember.batch",
            "ember.callers",
            "ember.lanes",
            "ember.prompts",
            "ember.logs",
            "ember.metrics",
            "ember.cpu",
            "ember.installed",
            "ember.backend_table",
            "ember.backend_settings",
            "ember.outputs",
            "ember.chunking",
        ),
    ),
    ("media", "fetching and decoding images and audio, and their limits", ("ember.media",)),
    (
        "models",
        "what a model is, shared by every family: specs, processors (text to tokens), heads",
        ("ember.models", "ember.processors", "ember.heads"),
    ),
    (
        "backends",
        "the runtimes that run a network (torch, onnx, ct2, neuron, numpy)",
        ("ember.backends",),
    ),
    (
        "families",
        "one package per family: its detection, facts, processor, heads and load hook, "
        "on top of the shared machinery and runtimes; backends reach a family only through "
        "its row's hooks on the model",
        ("ember.families",),
    ),
    (
        "config",
        "settings: CLI flag = EMBER_* env = default, resolved once into model specs",
        (
            "ember.config",
            "ember.config_values",
            "ember.config_limits",
            "ember.infinity_options",
            "ember.tei_options",
            "ember.env_check",
        ),
    ),
    (
        "engine",
        "batching, caching and running requests on a backend",
        ("ember.engine", "ember.tracing"),
    ),
    ("api", "the HTTP routes and their dialects", ("ember.api",)),
    (
        "top",
        "entry points: the CLI, corpus jobs, Ray, the platform adapters' core and the "
        "embedded (Infinity-compatible) API",
        (
            "ember.__main__",
            "ember.cli",
            "ember.jobs",
            "ember.ray",
            "ember.platform",
            "ember.infinity",
        ),
    ),
)
BAND_ORDER = {name: rank for rank, (name, _, _) in enumerate(BANDS)}

# Runtime modules: what loads or runs a network, and the libraries they run on.
RUNTIME_MODULES = (
    "ember.backends.torch_backend",
    "ember.backends.torch_media",
    "ember.backends.torch_causal",
    "ember.backends.onnx_backend",
    "ember.backends.onnx_media",
    "ember.backends.onnx_export",
    "ember.backends.onnx_media_export",
    "ember.backends.onnx_int8",
    "ember.backends.ct2_backend",
    "ember.backends.neuron_backend",
    "ember.backends.neuron_export",
    "ember.backends.openvino_backend",
)
RUNTIME_LIBRARIES = (
    "torch",
    "onnx",
    "onnxruntime",
    "ctranslate2",
    "torch_neuronx",
    "optimum",
    "openvino",
    "tensorrt",
)


@dataclass(frozen=True)
class Arrow:
    """One import: ``source`` imports ``target`` (a module of core/ember, or a library)."""

    source: str
    target: str
    path: str  # the importing file, relative to core/
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.path}:{self.line})"


def _module_name(path: Path, core: Path) -> str:
    parts = path.relative_to(core).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Every import a module runs (at import time or lazily), as (name, line)."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.found: list[tuple[str, int]] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(alias.name, node.lineno) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = parts[: len(parts) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        # ``from pkg import sub`` imports the submodule when there is one, and reads it off
        # ``pkg``: both count as imported (a package's ``__init__`` re-exporting its
        # submodules then closes a loop with any submodule that imports siblings so).
        self.found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
        self.found.append((module, node.lineno))


def scan(source: str, package: str) -> list[tuple[str, int]]:
    """The imports in ``source`` (a module of ``package``), TYPE_CHECKING ones left out."""
    visitor = _Imports(package)
    visitor.visit(ast.parse(source))
    return visitor.found


def _resolve(name: str, modules: Iterable[str]) -> str:
    known = set(modules)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _packages_run(target: str, source: str, modules: Iterable[str]) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs from ``source``: each
    package above it, but not those above ``source`` (already imported to reach it)."""
    known = set(modules)
    parts = target.split(".")
    above = {".".join(parts[:n]) for n in range(1, len(parts))}
    mine = {".".join(source.split(".")[:n]) for n in range(1, len(source.split(".")) + 1)}
    return sorted(p for p in above - mine if p in known)


def arrows(core: Path = CORE) -> tuple[list[str], list[Arrow]]:
    """The modules of ``core/ember`` and every import arrow between them, or out of them to
    a library (its top-level name)."""
    paths = {_module_name(p, core): p for p in sorted((core / "ember").rglob("*.py"))}
    found: dict[tuple[str, str], Arrow] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for name, line in scan(path.read_text(encoding="utf-8"), package):
            if name == "ember" or name.startswith("ember."):
                target = _resolve(name, paths)
            else:
                target = name.split(".")[0]
            rel = str(path.relative_to(core))
            for reached in [target, *_packages_run(target, module, paths)]:
                if reached and reached != module and (module, reached) not in found:
                    found[(module, reached)] = Arrow(module, reached, rel, line)
    return sorted(paths), sorted(found.values(), key=lambda a: (a.source, a.target))


def band_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for name, _, prefixes in BANDS:
        for prefix in prefixes:
            if module == prefix or (prefix != "ember" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), name)
    return best[1] if best else None


def _is_under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def forbidden(arrow: Arrow) -> str | None:
    """The rule ``arrow`` breaks, in words, or None when it may stand."""
    source, target = arrow.source, arrow.target
    is_ember = target == "ember" or target.startswith("ember.")
    if _is_under(source, ("ember.api",)) and (
        _is_under(target, RUNTIME_MODULES) or (not is_ember and target in RUNTIME_LIBRARIES)
    ):
        return "routes (ember.api) import no runtime: they reach networks through the engine"
    if not is_ember:
        return None
    if band_of(source) == "config" and _is_under(target, ("ember.backends",)):
        return (
            "config imports no backend module: what it shares with backends lives on the "
            "ground floor (ember.backend_table, ember.backend_settings, ember.defaults)"
        )
    low, high = band_of(source), band_of(target)
    if low is None or high is None or BAND_ORDER[high] <= BAND_ORDER[low]:
        return None
    if low == "ground":
        return f"the ground floor imports nothing above it (here: {high})"
    return f"a lower band imports no higher one ({low} imports {high})"


def components(modules: list[str], found: list[Arrow]) -> list[list[str]]:
    """The modules of each import cycle (strongly connected set), smallest set first."""
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    graph.add_edges_from((a.source, a.target) for a in found if a.target in graph)
    sets = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    return sorted(sets, key=lambda c: (len(c), c))


def cycle_report(modules: list[str], found: list[Arrow]) -> list[str]:
    """One paragraph per cycle: its modules and one loop through them, arrow by arrow."""
    graph = nx.DiGraph()
    by_edge = {(a.source, a.target): a for a in found if a.target in modules}
    graph.add_edges_from(by_edge)
    lines = []
    for members in components(modules, found):
        loop = nx.find_cycle(graph.subgraph(members), members[0])
        lines.append(
            f"import cycle of {len(members)} modules ({', '.join(members)}); "
            "rule: no import cycle, lazy imports included; one loop:\n"
            + "\n".join(f"    {by_edge[edge]}" for edge in loop)
        )
    return lines


def arrow_report(found: list[Arrow]) -> list[str]:
    return [f"{arrow}: {rule}" for arrow in found if (rule := forbidden(arrow))]


def main(argv: list[str]) -> int:
    core = Path(argv[0]) if argv else CORE
    modules, found = arrows(core)
    sets = components(modules, found)
    bad = arrow_report(found)
    print(f"{len(sets)} cycles {sorted(len(s) for s in sets)}; {len(bad)} forbidden arrows")
    for line in cycle_report(modules, found) + bad:
        print(line)
    return 1 if sets or bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
