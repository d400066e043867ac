"""A PyLate ColBERT: token states -> its Dense projection -> one normalised vector per
token; queries and documents encoded as PyLate encodes them (``processor.py``); reranks by
MaxSim (the shared multi-vector head and scoring)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ember.families.base import Condition, Family, ModelFiles, lazy

if TYPE_CHECKING:
    import numpy as np

    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel


def heads(model: ResolvedModel) -> dict[Output, Head]:
    """PyLate: the Dense module(s) after the Transformer, applied to each token state."""
    from ember.errors import ConfigError
    from ember.heads.multivector import MultiVectorHead
    from ember.models.weights import read_checkpoint

    assert model.root is not None
    weight: np.ndarray | None = None
    bias: np.ndarray | None = None
    modules = json.loads((model.root / "modules.json").read_text())
    for module in modules:
        if not str(module.get("type", "")).endswith(".Dense"):
            continue
        directory = model.root / module["path"]
        cfg = json.loads((directory / "config.json").read_text())
        activation = str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))
        if not activation.endswith("Identity") or cfg.get("use_residual"):
            raise ConfigError(
                f"{directory}: a Dense with activation {activation} or a residual is not "
                "supported; Ember serves PyLate's identity projection"
            )
        t = read_checkpoint(directory)
        w, b = t["linear.weight"], t.get("linear.bias")
        if weight is None:
            weight, bias = w, b
        else:  # Dense layers in a row compose into one affine map
            bias = (bias @ w.T if bias is not None else 0) + (b if b is not None else 0)
            weight = w @ weight
    return {"multi": MultiVectorHead(weight, bias)}


def query_expansion(model: ResolvedModel) -> tuple[bool, bool]:
    """Whether queries are expanded with [MASK] tokens, and whether those are attended, as
    config_sentence_transformers.json says (PyLate's defaults: expanded, not attended)."""
    assert model.root is not None
    path = model.root / "config_sentence_transformers.json"
    cfg = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    expand = bool(cfg.get("do_query_expansion", True))
    return expand, expand and bool(cfg.get("attend_to_expansion_tokens"))


def expansion_attended_or_off(model: ResolvedModel) -> bool:
    """Whether every position a query returns is attended (expansion attended or off)."""
    expand, attended = query_expansion(model)
    return attended or not expand


def detect(files: ModelFiles) -> bool:
    if files.modules.start is not None or files.task != "embed":
        return False
    # PyLate's own Dense class, or a save with sentence-transformers' Dense and PyLate's
    # query and document lengths.
    return files.modules.pylate or {"query_length", "document_length"} <= files.st_config.keys()


COLBERT = Family(
    name="colbert",
    title="ColBERT",
    backbone="encoder",
    outputs=("multi",),
    detect=detect,
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=heads,
    processor=lazy("ember.families.colbert.processor", "ColbertTokenizer"),
    detected_by="a PyLate checkpoint (`pylate.models.Dense`, `query_length`/`document_length`)",
    example="lightonai/GTE-ModernColBERT-v1",
    scoring="maxsim",
    exportable=False,
    # CTranslate2 takes each row's length, not a mask: it computes no state at a position
    # past it, and PyLate's default query returns its masked expansion positions.
    conditions=(
        Condition(
            "ct2",
            "query expansion attended or off",
            expansion_attended_or_off,
            "its queries return query-expansion positions masked from attention "
            "(attend_to_expansion_tokens false), which ct2 does not compute (it takes lengths)",
        ),
    ),
)
