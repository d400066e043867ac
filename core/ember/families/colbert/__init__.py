"""A PyLate ColBERT: token states -> its Dense projection -> one normalised vector per
token; queries and documents encoded as PyLate encodes them (``processor.py``); reranks by
MaxSim (the shared multi-vector head and scoring)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy

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
)
