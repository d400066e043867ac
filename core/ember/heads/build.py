"""Each kind's heads, built from the model's own files (the capability table's rooms)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from ember.capabilities import Output
from ember.errors import ConfigError
from ember.heads.base import Head
from ember.heads.dense import AnswerTokensHead, DenseHead, LogitsHead, PooledHead, Projection
from ember.heads.media import TokenVectorsHead, TowerHead
from ember.heads.multivector import MultiVectorHead
from ember.heads.router import RoutedHead
from ember.heads.sparse import LexicalWeightsHead, MlmHead, SpladeHead, VocabularyWeightsHead
from ember.models.spec import DenseLayer, ResolvedModel
from ember.models.weights import read_checkpoint, read_tensors
from ember.processors.text import declared_token_ids, load_tokenizer

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


def _colbert_heads(model: ResolvedModel) -> dict[Output, Head]:
    """PyLate: the Dense module(s) after the Transformer, applied to each token state."""
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


def _projection(layer: DenseLayer) -> Projection:
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


def _dense_heads(model: ResolvedModel) -> dict[Output, Head]:
    """Pooling (its modes, with or without the prompt), then the Dense layers."""
    projections = tuple(_projection(layer) for layer in model.dense_layers)
    return {"dense": DenseHead(model.poolings, model.include_prompt, projections)}


def _splade_heads(model: ResolvedModel) -> dict[Output, Head]:
    log_twice = model.sparse_activation == "log1p_relu"
    return {"sparse": SpladeHead(load_mlm_head(model), log_twice=log_twice)}


def _router_heads(model: ResolvedModel) -> dict[Output, Head]:
    """Each route's heads, built from its own files; one RoutedHead per output."""
    assert model.routes is not None and model.kind is not None
    routes = model.routes.models
    built = {name: build_heads(sub) for name, sub in routes.items()}
    normalized = frozenset(name for name, sub in routes.items() if sub.normalize)
    return {
        output: RoutedHead(output, {r: heads[output] for r, heads in built.items()}, normalized)
        for output in model.kind.outputs
    }


def _bge_m3_heads(model: ResolvedModel) -> dict[Output, Head]:
    assert model.root is not None
    colbert = read_tensors(model.root / "colbert_linear.pt")
    sparse = read_tensors(model.root / "sparse_linear.pt")
    names = ("cls_token", "eos_token", "pad_token", "unk_token")  # FlagEmbedding's unused ids
    dropped = frozenset(declared_token_ids(load_tokenizer(model.path), model.path, names).values())
    return {
        "dense": DenseHead(model.pooling),
        "sparse": LexicalWeightsHead(sparse["weight"], sparse["bias"], dropped),
        "multi": MultiVectorHead(colbert["weight"], colbert["bias"], skip_first=True),
    }


BUILDERS: dict[str, Callable[[ResolvedModel], dict[Output, Head]]] = {
    "dense": _dense_heads,
    "cross-encoder": lambda m: {"logits": LogitsHead()},
    "classifier": lambda m: {"logits": LogitsHead()},
    "llm-reranker": lambda m: {"logits": AnswerTokensHead()},
    "colbert": _colbert_heads,
    "splade": _splade_heads,
    "static": lambda m: {"dense": PooledHead(tuple(map(_projection, m.dense_layers)))},
    "sparse-static": lambda m: {"sparse": VocabularyWeightsHead()},
    "router": _router_heads,
    "sparse-router": _router_heads,
    "bge-m3": _bge_m3_heads,
    "clip": lambda m: {"dense": TowerHead()},
    "siglip": lambda m: {"dense": TowerHead()},
    "clap": lambda m: {"dense": TowerHead()},
    "colpali": lambda m: {"multi": TokenVectorsHead()},
    "colqwen2": lambda m: {"multi": TokenVectorsHead()},
}


def build_heads(model: ResolvedModel) -> dict[Output, Head]:
    assert model.kind is not None
    return BUILDERS[model.kind.name](model)
