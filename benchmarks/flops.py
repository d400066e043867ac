"""Model FLOPs of an encoder forward pass, for achieved-fraction-of-peak figures.

FLOPs(sequence of L tokens) = 2 * P_ne * L + 4 * n_layers * d_model * L^2, where P_ne counts
the transformer layers' weights (no embeddings, no pooler): every weight is one multiply-add
per token, and the L^2 term is QK^T plus attention x V. Only unpadded tokens count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP formula needs, read from config.json and the safetensors header."""

    params_non_embedding: int
    n_layers: int
    d_model: int

    def flops(self, n_tokens: int) -> float:
        p, layers, d = self.params_non_embedding, self.n_layers, self.d_model
        return float(2 * p * n_tokens + 4 * layers * d * n_tokens * n_tokens)


def model_shape(model: Path) -> ModelShape:
    from safetensors import safe_open

    config = json.loads((model / "config.json").read_text())
    with safe_open(str(model / "model.safetensors"), "np") as f:
        total = sum(int(np.prod(f.get_slice(k).get_shape())) for k in f.keys() if ".layer." in k)
    return ModelShape(total, int(config["num_hidden_layers"]), int(config["hidden_size"]))
