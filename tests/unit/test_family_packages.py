"""Each family is a package (``ember/families/<name>/``) that shared code never imports:
the engine, the API, the runtimes and the shared processors and heads reach a family's own
code only through its registry row's hooks and the model's facts, so adding or changing a
family touches its package and its row only (docs/architecture.md, "Add a family")."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from ember.families.registry import FAMILIES, Family

PACKAGE = Path(__file__).resolve().parents[2] / "core" / "ember"
FAMILIES_DIR = PACKAGE / "families"
PACKAGES = sorted(p.name for p in FAMILIES_DIR.iterdir() if (p / "__init__.py").exists())


def _imported(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _family_imports(path: Path) -> list[str]:
    """Imports of a family package (``ember.families.<package>``, or ``from
    ember.families import <package>``) in one module."""
    hits = []
    for line, name in _imported(path):
        parts = name.split(".")
        if parts[:2] == ["ember", "families"] and len(parts) > 2 and parts[2] in PACKAGES:
            hits.append(f"{path.name}:{line}: {name}")
    return hits


def test_every_family_row_is_declared_in_a_package_of_its_own() -> None:
    declared: dict[str, str] = {}
    for package in PACKAGES:
        module = importlib.import_module(f"ember.families.{package}")
        for value in vars(module).values():
            rows = value if isinstance(value, tuple) else (value,)
            for row in rows:
                if isinstance(row, Family):
                    declared.setdefault(row.name, package)
    assert set(declared) == {family.name for family in FAMILIES}


def test_no_module_outside_the_families_imports_a_family_package() -> None:
    outside = [p for p in sorted(PACKAGE.rglob("*.py")) if FAMILIES_DIR not in p.parents]
    offenders = [hit for path in outside for hit in _family_imports(path)]
    assert not offenders, "reach a family through its row's hooks or facts:\n" + "\n".join(
        offenders
    )


def test_the_check_sees_an_import_of_a_family_package(tmp_path: Path) -> None:
    """The walk is not vacuous: an import of a family's code, at the top or in a function,
    is caught, and one of the registry or the Family type is not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from ember.families.registry import FAMILIES\n"
        "from ember.families.base import Family\n"
        "def f():\n"
        "    from ember.families.router.backend import load_routes\n"
        "    import ember.families.llm_cross_encoder.prompt\n"
    )
    assert len(_family_imports(sample)) == 2
    assert {"router", "llm_cross_encoder", "llm_reranker"} <= set(PACKAGES)
