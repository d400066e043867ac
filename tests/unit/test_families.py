"""The family registry: every family declares all it is in one module, nothing outside
ember/families names one, and the README's supported-models table is the registry's."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from ember.backends.registry import BACKEND_NAMES, REGISTRY
from ember.capabilities import OUTPUT_NOUNS
from ember.families.registry import FAMILIES, by_name, for_task
from ember.families.table import readme_block, supported_models_table

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "core" / "ember"
NAMES = {family.name for family in FAMILIES}
# Family names that are also words of the shared vocabulary (an Output, a Scoring): as
# literals they mean those, so only comparisons with a family's name catch them (below).
SHARED_WORDS = {"dense", "cross-encoder"}
# Literals that equal a family's name but are another library's word, by module.
OTHER_VOCABULARIES = {
    ("backends/onnx_media_export.py", "clip"): "ONNX Runtime's optimizer model_type",
    ("api/dialects/tei.py", "classifier"): "TEI's /info model_type key",
    ("tei_options.py", "splade"): "text-embeddings-router's --pooling value",
    ("api/docs.py", "static"): "fastapi-offline's asset folder",
}


def _modules_outside_families() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "families" not in p.parts]


def _names_a_family(path: Path, relative: str | None = None) -> list[str]:
    """Literals equal to a family's name, and comparisons with ``<x>.family.name``."""
    found = []
    relative = relative or path.relative_to(PACKAGE).as_posix()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value
            if word in NAMES - SHARED_WORDS and (relative, word) not in OTHER_VOCABULARIES:
                found.append(f"{relative}:{node.lineno}: {word!r}")
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if (
                    isinstance(side, ast.Attribute)
                    and side.attr == "name"
                    and isinstance(side.value, ast.Attribute)
                    and side.value.attr == "family"
                ):
                    found.append(f"{relative}:{node.lineno}: compares a family's name")
    return found


def test_no_module_outside_the_families_names_one() -> None:
    offenders = [hit for path in _modules_outside_families() for hit in _names_a_family(path)]
    assert not offenders, "branch on the family's facts, not its name:\n" + "\n".join(offenders)


def test_the_check_sees_a_module_that_names_a_family(tmp_path: Path) -> None:
    """The walk is not vacuous: a switch on a family, as the code once had, is caught."""
    source = tmp_path / "sample.py"
    source.write_text('def f(model):\n    return model.family.name == "x" or "siglip"\n')
    hits = _names_a_family(source, "processors/sample.py")
    assert len(hits) == 2, hits
    for vocabulary in OTHER_VOCABULARIES:  # each exemption still names a real literal
        assert vocabulary[1] in NAMES
        assert repr(vocabulary[1]) in repr(
            [
                n.value
                for n in ast.walk(ast.parse((PACKAGE / vocabulary[0]).read_text()))
                if isinstance(n, ast.Constant)
            ]
        ), vocabulary


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_family_declares_what_it_is(family) -> None:  # type: ignore[no-untyped-def]
    for hook in (family.detect, family.resolve, family.heads, family.processor):
        assert callable(hook)
    assert family.backends and set(family.backends) <= set(BACKEND_NAMES)
    assert family.cpu_backend in REGISTRY
    assert family.outputs and set(family.outputs) <= set(OUTPUT_NOUNS)
    assert family.title and family.detected_by and family.example
    assert (family.media is not None) == (len(family.modalities) > 1)
    assert (family.table is not None) == (family.backbone == "token-table")
    conditional = [c.backend for c in family.conditions]  # one condition per backend
    assert len(set(conditional)) == len(conditional) and set(conditional) <= set(family.backends)
    assert all(c.words and c.why and callable(c.met) for c in family.conditions)
    assert pickle.loads(pickle.dumps(family)) is family  # crosses to a build child by name
    assert by_name(family.name) is family


def test_the_plain_family_of_each_task() -> None:
    assert [for_task(t).name for t in ("embed", "rerank", "classify")] == [
        "dense",
        "cross-encoder",
        "classifier",
    ]


def test_the_readme_table_is_the_registry() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_block(readme) == supported_models_table(), (
        "README.md's supported-models table is stale: "
        "PYTHONPATH=core python -m ember.families.table --write README.md"
    )
    for family in FAMILIES:
        assert f"(`{family.name}`)" in readme_block(readme)
