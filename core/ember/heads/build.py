"""What several families' heads are built from: an MLM head (SPLADE), a Dense module's
projection; and the one call the engine makes for a model's heads."""

from __future__ import annotations

import numpy as np

from ember.capabilities import Output
from ember.errors import ConfigError
from ember.heads.base import Head
from ember.heads.dense import Projection
from ember.heads.sparse import MlmHead
from ember.models.spec import DenseLayer, ResolvedModel
from ember.models.weights import read_checkpoint

# MLM head tensors by architecture family: transform dense, LayerNorm, decoder, bias.
_MLM_KEYS = {
    "bert": (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        ("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
        ("cls.predictions.bias", "cls.predictions.decoder.bias"),
    ),
    "roberta": (
        "lm_head.dense",
        "lm_head.layer_norm",
        ("lm_head.decoder.weight", "roberta.embeddings.word_embeddings.weight"),
        ("lm_head.bias", "lm_head.decoder.bias"),
    ),
    "distilbert": (
        "vocab_transform",
        "vocab_layer_norm",
        ("vocab_projector.weight", "distilbert.embeddings.word_embeddings.weight"),
        ("vocab_projector.bias",),
    ),
}


def load_mlm_head(model: ResolvedModel) -> MlmHead:
    family = {"xlm-roberta": "roberta", "camembert": "roberta"}.get(
        model.model_type, model.model_type
    )
    if family not in _MLM_KEYS:
        raise ConfigError(f"SPLADE on {model.model_type!r}: no MLM head layout known")
    dense, norm, decoder, bias = _MLM_KEYS[family]
    names = [*(f"{p}.{s}" for p in (dense, norm) for s in ("weight", "bias")), *decoder, *bias]
    t = read_checkpoint(model.path, names)

    def first(names: tuple[str, ...]) -> np.ndarray:
        for name in names:
            if name in t:
                return t[name]
        raise ConfigError(f"{model.path}: none of {names} in the weights (not an MLM model?)")

    act = str(model.config.get("hidden_act") or model.config.get("activation") or "gelu")
    if family == "roberta":
        act = "gelu"  # RobertaLMHead applies gelu whatever hidden_act says
    eps = float(model.config.get("layer_norm_eps") or 1e-12)
    return MlmHead(
        dense_w=first((dense + ".weight",)),
        dense_b=first((dense + ".bias",)),
        norm_w=first((norm + ".weight",)),
        norm_b=first((norm + ".bias",)),
        eps=eps,
        act=act,
        decoder_w=first(decoder),
        decoder_b=first(bias),
    )


def projection(layer: DenseLayer) -> Projection:
    """A sentence-transformers Dense module's weights, checked against its config."""
    t = read_checkpoint(layer.path)
    weight, bias = t.get("linear.weight"), t.get("linear.bias")
    if weight is None or weight.shape != (layer.out_features, layer.in_features):
        shape = None if weight is None else weight.shape
        raise ConfigError(
            f"{layer.path}: linear.weight is {shape}, the config says "
            f"({layer.out_features}, {layer.in_features})"
        )
    if layer.bias != (bias is not None):
        raise ConfigError(f"{layer.path}: bias {layer.bias} in the config, not in the weights")
    residual = t.get("residual.weight") if layer.in_features != layer.out_features else None
    if layer.residual and layer.in_features != layer.out_features and residual is None:
        raise ConfigError(f"{layer.path}: use_residual needs residual.weight in the weights")
    return Projection(weight, bias, layer.activation, layer.residual, residual)


def build_heads(model: ResolvedModel) -> dict[Output, Head]:
    """The heads the model's family builds from its files (``Family.heads``)."""
    return model.family.heads(model)
