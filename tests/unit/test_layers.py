"""The layer map (``tests/unit/layer_map.py``) holds: every module of core/ember has a band,
no import cycle (lazy imports included), no forbidden arrow, and backends read the settings
they are given rather than the model's spec. Each failure names the arrow or cycle and the
rule it breaks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit import layer_map as lm

MODULES, ARROWS = lm.arrows()


def test_every_module_has_a_band() -> None:
    unplaced = [m for m in MODULES if lm.band_of(m) is None]
    assert not unplaced, "modules with no band in tests/unit/layer_map.py BANDS: " + ", ".join(
        unplaced
    )


def test_no_import_cycle() -> None:
    report = lm.cycle_report(MODULES, ARROWS)
    assert not report, "\n".join(report)


def test_no_forbidden_arrow() -> None:
    report = lm.arrow_report(ARROWS)
    assert not report, "\n".join(report)


def test_backends_read_settings_not_the_spec() -> None:
    """A backend is told the few settings it needs (``ResolvedModel.runtime``, an
    ``ember.backend_settings.BackendSettings``), never the whole ``ModelSpec``."""
    backends = lm.CORE / "ember" / "backends"
    reads = sorted(
        f"{path.relative_to(lm.CORE)}:{node.lineno}: .spec"
        for path in sorted(backends.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "spec"
    )
    assert not reads, "backends read model.spec (use model.runtime):\n" + "\n".join(reads)


# ---- the checker itself: it sees what it must, and its rules fire ------------------------


def test_the_scan_counts_lazy_imports_and_not_type_checking_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ember.engine import Engine\n"
        "else:\n"
        "    import ember.logs\n"
        "def f():\n"
        "    from ember.config import ServerSettings\n"
        "    from . import sibling\n"
        "    from ..heads import dense\n"
    )
    found = lm.scan(source, "ember.models")
    names = [name for name, _ in found]
    assert ("ember.config.ServerSettings", 7) in found
    assert "ember.logs" in names
    assert "ember.models.sibling" in names
    assert "ember.heads.dense" in names
    assert not any(name.startswith("ember.engine") for name in names)


def test_the_graph_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "ember"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("def f():\n    from ember import capabilities\n")
    (package / "capabilities.py").write_text("from ember.errors import f\n")
    modules, found = lm.arrows(tmp_path)
    report = lm.cycle_report(modules, found)
    assert len(report) == 1
    assert "ember.errors -> ember.capabilities (ember/errors.py:2)" in report[0]
    assert "ember.capabilities -> ember.errors (ember/capabilities.py:1)" in report[0]


def test_importing_a_submodule_runs_its_packages_init(tmp_path: Path) -> None:
    """``from ember.kinds.a import x`` runs ``ember/kinds/__init__.py`` first: a registry
    there that imports every kind closes a loop through any kind that a module the kinds
    use imports (the families registry once sat so in ``families/__init__.py``)."""
    package = tmp_path / "ember"
    (package / "kinds").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "kinds" / "__init__.py").write_text("from ember.kinds.a import A\n")
    (package / "kinds" / "a.py").write_text("from ember.shared import helper\nA = 1\n")
    (package / "shared.py").write_text("def helper():\n    from ember.kinds.a import A\n")
    modules, found = lm.arrows(tmp_path)
    assert "ember.shared -> ember.kinds (ember/shared.py:2)" in {str(a) for a in found}
    assert lm.components(modules, found) == [["ember.kinds", "ember.kinds.a", "ember.shared"]]
    # A module of the package itself finds its package already imported: no arrow up.
    assert not [a for a in found if (a.source, a.target) == ("ember.kinds.a", "ember.kinds")]


@pytest.mark.parametrize(
    ("source", "target", "rule"),
    [
        ("ember.errors", "ember.config", "the ground floor imports nothing above it"),
        ("ember.models.spec", "ember.backends.base", "a lower band imports no higher one"),
        ("ember.backends.base", "ember.engine.engine", "a lower band imports no higher one"),
        ("ember.backends.choice", "ember.api.app", "a lower band imports no higher one"),
        ("ember.config", "ember.backends.registry", "config imports no backend module"),
        ("ember.api.app", "ember.backends.torch_backend", "routes (ember.api) import no runtime"),
        ("ember.api.app", "torch", "routes (ember.api) import no runtime"),
    ],
)
def test_each_rule_fires(source: str, target: str, rule: str) -> None:
    found = lm.forbidden(lm.Arrow(source, target, "x.py", 1))
    assert found is not None and found.startswith(rule)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("ember.engine.engine", "ember.backends.base"),
        ("ember.config", "ember.models.spec"),
        ("ember.backends.onnx_backend", "ember.processors.text"),
        ("ember.platform", "ember.backends.torch_backend"),
        ("ember.api.operations", "ember.heads.quantize"),
        ("ember.backends.torch_backend", "torch"),
    ],
)
def test_arrows_down_the_map_stand(source: str, target: str) -> None:
    assert lm.forbidden(lm.Arrow(source, target, "x.py", 1)) is None
