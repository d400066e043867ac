"""Settings flow one way: the layers under the settings (models, families, processors,
heads, backends, media, the shared batch types) import neither the settings nor anything
above them, lazily or not; what they share with the settings is ember.defaults."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "core" / "ember"
LOWER = ("models", "families", "processors", "heads", "backends", "media")
LOWER_MODULES = ("batch.py", "capabilities.py", "defaults.py", "errors.py", "cpu.py")
UPPER = ("ember.config", "ember.api", "ember.engine", "ember.jobs", "ember.cli", "ember.platform")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def _lower_modules() -> list[Path]:
    paths = [p for d in LOWER for p in sorted((PACKAGE / d).rglob("*.py"))]
    return paths + [PACKAGE / name for name in LOWER_MODULES]


def test_lower_layers_import_nothing_above_them() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{line}: {module}"
        for path in _lower_modules()
        for line, module in _imports(path)
        if any(module == up or module.startswith(up + ".") for up in UPPER)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_scan_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from ember.config import ServerSettings\n")
    assert _imports(sample) == [(2, "ember.config")]
