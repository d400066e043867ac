"""The README's supported-models table, written from the registry (family × backend, with
an example checkpoint each); tests/unit/test_families.py keeps the README equal to it.

``PYTHONPATH=core python -m ember.families.table --write README.md`` rewrites it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from ember.backend_table import BACKEND_NAMES
from ember.families.base import Family
from ember.families.registry import FAMILIES

START, END = "<!-- supported-models:start -->", "<!-- supported-models:end -->"
_SCORING = {
    "cross-encoder": "activation_fn(logit), sigmoid by default",
    "maxsim": "MaxSim",
    "llm": "answer-token logits",
}


def cpu_auto(family: Family) -> str:
    """What ``--backend auto`` picks for the family on a CPU (ember.backends.choice)."""
    if family.only_backend:
        return family.only_backend
    if not family.runs_on("onnx") or family.cpu_backend == "torch":
        return "torch"
    return "onnx"


def _columns() -> list[str]:
    """The backends some family runs (openvino is reached through auto and --dtype, never
    named by a family: no column)."""
    return [b for b in BACKEND_NAMES if any(f.runs_on(b) for f in FAMILIES)]


def _cell(family: Family, backend: str) -> str:
    if family.backbone == "routes":
        return "its routes'"
    if not family.runs_on(backend):
        return "–"
    mark = "✓ auto" if cpu_auto(family) == backend else "✓"
    condition = family.condition(backend)
    return f"{mark} ({condition.words})" if condition else mark


def _row(family: Family) -> str:
    outputs = ", ".join(f"`{c}`" for c in family.capabilities if c != "rerank") or "–"
    rerank = _SCORING[family.scoring] if family.scoring else "–"
    cells = [
        f"{family.title} (`{family.name}`)",
        family.detected_by,
        outputs,
        rerank,
        *(_cell(family, b) for b in _columns()),
        family.example,
    ]
    return "| " + " | ".join(cells) + " |"


def supported_models_table() -> str:
    header = ["family (`kind`)", "detected by", "serves", "rerank", *_columns(), "example"]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *(_row(f) for f in FAMILIES),
    ]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """The table as the README holds it, between its markers."""
    found = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    if found is None:
        raise ValueError(f"no {START} ... {END} block")
    return found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="rewrite the table in this file")
    args = parser.parse_args()
    table = supported_models_table()
    if args.write is None:
        print(table)
        return
    text = args.write.read_text(encoding="utf-8")
    old = readme_block(text)
    args.write.write_text(text.replace(old, table), encoding="utf-8")


if __name__ == "__main__":
    main()
