"""What a sentence-transformers save says: modules.json's pipeline, Pooling and Dense
configs (5.x and 6.x formats), prompts. Read here, checked here; ``resolve`` turns them
into a ``ResolvedModel``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.errors import ConfigError
from ember.models.spec import DenseLayer, Pooling, SparseActivation


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class StPooling:
    """A Pooling module's config, in either format: its modes (concatenated in this order),
    the token width it pools and whether it pools prompt tokens."""

    modes: tuple[Pooling, ...]
    width: int | None = None  # of one mode; the output is len(modes) times it
    include_prompt: bool = True


@dataclass(frozen=True)
class StModules:
    """What modules.json says: where the transformer is, and what follows it."""

    transformer_dir: Path
    pooling: StPooling | None = None
    normalize: bool = False
    # The input module when it is no transformer (StaticEmbedding, SparseStaticEmbedding,
    # Router): its directory holds what it reads (tokenizer and table; router_config.json).
    start: str | None = None
    dense: tuple[Path, ...] = ()  # sentence-transformers Dense modules' directories
    sparse_activation: SparseActivation = "relu"  # SpladePooling's
    mlm: bool = False  # an MLMTransformer or SpladePooling: a SPLADE SparseEncoder
    pylate: bool = False  # PyLate's Dense: a ColBERT
    # A module that ends the pipeline with the score a family reads from its own files
    # (one a family claims: ``Family.score_module``): its type's name and directory.
    score: tuple[str, Path] | None = None


# Module types by the last part of their class path (sentence_transformers.models.* in 5.x,
# sentence_transformers.base.modules.* / .sentence_transformer.modules.* in 6.x); any
# other module is refused.
_COLBERT_MODULES = ("pylate.models.Dense", "pylate.models.Dense.Dense")
# Input modules that are no transformer: a table per token id, or a Router's routes.
TABLE_MODULES = ("StaticEmbedding", "SparseStaticEmbedding")
ROUTER = "Router"
_INPUT_MODULES = (*TABLE_MODULES, ROUTER)
# What Ember serves of a pipeline without a family's score module, for the refusal.
_SERVED = [
    "Transformer + Pooling (+ Dense, Normalize) models",
    "StaticEmbedding",
    "Router",
    "PyLate ColBERT",
    "SPLADE SparseEncoder",
]


def st_modules(root: Path, scorers: Mapping[str, str] | None = None) -> StModules:
    """modules.json's pipeline; ``scorers``: the score modules families claim, by type
    name, each with what the family calls such a model (the registry's
    ``SCORE_MODULES``)."""
    modules = read_json(root / "modules.json")
    if not modules:
        return StModules(root)
    entries = [(str(m.get("type", "")), root / m.get("path", "")) for m in modules]
    return st_pipeline(root, entries, root / "modules.json", scorers)


def st_pipeline(
    root: Path,
    entries: list[tuple[str, Path]],
    where: Path,
    scorers: Mapping[str, str] | None = None,
) -> StModules:
    """One pipeline's modules in order (modules.json's, or a Router route's), each a
    (type, directory) pair; ``where`` names the file that lists them, for errors. A
    module in ``scorers`` must follow the Transformer and end the pipeline: its output
    is the score."""
    scorers = scorers or {}
    transformer_dir, pooling, normalize, start = root, None, False, None
    mlm = pylate = False
    dense: list[Path] = []
    score: tuple[str, Path] | None = None
    activation: SparseActivation = "relu"
    for index, (full, mpath) in enumerate(entries):
        name = full.rsplit(".", 1)[-1]
        if name in _INPUT_MODULES:
            if index:
                raise ConfigError(f"{where}: {name} must be the first module (it reads the text)")
            transformer_dir, start = mpath, name
        elif score is not None:
            scorer = score[0]
            raise ConfigError(
                f"{where}: a {name} module after {scorer} is not supported; Ember serves a "
                f"{scorers[scorer]}, its score as {scorer} leaves it"
            )
        elif name in scorers:
            if index != 1 or start is not None:
                raise ConfigError(
                    f"{where}: {name} must follow the Transformer directly (Ember serves "
                    f"Transformer + {name})"
                )
            score = (name, mpath)
        elif start == ROUTER and name != "Normalize":
            raise ConfigError(
                f"{where}: a {name} module after a Router is not supported; Ember serves a "
                "Router alone or followed by Normalize"
            )
        elif name in ("Transformer", "MLMTransformer", "CLIPModel"):  # CLIPModel: ST < 5.4
            transformer_dir = mpath
            mlm = mlm or name == "MLMTransformer"
        elif name == "SpladePooling":
            activation = _check_splade_pooling(read_json(mpath / "config.json") or {}, mpath)
            mlm = True
        elif full in _COLBERT_MODULES or (full.startswith("pylate.") and name == "Dense"):
            pylate = True
        elif name == "Pooling":
            pooling = pooling_from_config(mpath / "config.json")
        elif name == "Dense":
            if normalize:
                raise ConfigError(
                    f"{root / 'modules.json'}: a Dense module after Normalize is not supported; "
                    "Ember normalises last"
                )
            dense.append(mpath)
        elif name == "Normalize":
            normalize = True
        else:
            *served, last = _SERVED + [f"{what} models" for what in scorers.values()]
            raise ConfigError(
                f"sentence-transformers module {name!r} in {where} is not supported yet; "
                f"Ember serves {', '.join(served)} and {last}"
            )
    return StModules(
        transformer_dir,
        pooling,
        normalize,
        start,
        tuple(dense),
        activation,
        mlm,
        pylate,
        score,
    )


def _check_splade_pooling(cfg: dict, path: Path) -> SparseActivation:
    strategy = cfg.get("pooling_strategy", "max")
    act = cfg.get("activation_function", "relu")
    if strategy != "max" or act not in ("relu", "log1p_relu"):
        raise ConfigError(
            f"{path}: SpladePooling {strategy}/{act} is not supported; Ember serves max with "
            "relu or log1p_relu"
        )
    return "relu" if act == "relu" else "log1p_relu"


# sentence-transformers' mode names -> Ember's, in the order its Pooling concatenates the
# 5.x boolean keys (cls, max, mean, mean_sqrt_len, weightedmean, lasttoken).
_ST_MODES: dict[str, Pooling] = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "last",
}
_ST5_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def pooling_from_config(path: Path) -> StPooling:
    """A Pooling module's config.json as sentence-transformers 6 reads it: 6.x's
    ``pooling_mode`` (a name or a list) and ``embedding_dimension``, or 5.x's
    ``pooling_mode_*`` booleans and ``word_embedding_dimension`` (none set: mean)."""
    cfg = read_json(path)
    if cfg is None:
        raise ConfigError(f"modules.json names a Pooling module but {path} is missing")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path} is not a Pooling config (a JSON object): {cfg!r}")
    width = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
    if "pooling_mode" in cfg:
        named = cfg["pooling_mode"]
        names = [named] if isinstance(named, str) else named
    elif any(key in cfg for key in _ST5_KEYS):
        names = [mode for key, mode in _ST5_KEYS.items() if cfg.get(key)] or ["mean"]
    elif width is not None:
        names = ["mean"]  # sentence-transformers' default mode
    else:
        raise ConfigError(
            f"{path} exists but holds no pooling mode Ember can read (neither 6.x "
            f"pooling_mode nor 5.x pooling_mode_* keys): {cfg}"
        )
    if not isinstance(names, list) or not names:
        raise ConfigError(f"{path}: pooling_mode {cfg.get('pooling_mode')!r} names no mode")
    unknown = [n for n in names if n not in _ST_MODES]
    if unknown:
        raise ConfigError(
            f"{path}: pooling mode {unknown[0]!r} is not one of sentence-transformers' "
            f"{', '.join(_ST_MODES)}"
        )
    if width is not None and not isinstance(width, int):
        raise ConfigError(f"{path}: embedding_dimension {width!r} is not an integer")
    include = cfg.get("include_prompt", True)
    return StPooling(tuple(_ST_MODES[n] for n in names), width, bool(include))


_ACTIVATIONS = ("Identity", "Tanh", "ReLU", "Sigmoid")


def dense_layer(directory: Path) -> DenseLayer:
    """A sentence-transformers Dense module's config.json (its weights are read by the
    heads); its defaults as the class has them (bias, Tanh)."""
    cfg = read_json(directory / "config.json")
    if not isinstance(cfg, dict):
        raise ConfigError(f"modules.json names a Dense module; {directory}/config.json is missing")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, "sentence_embedding") != "sentence_embedding":
            raise ConfigError(
                f"{directory}: a Dense on {cfg[key]!r} is not supported; Ember serves Dense "
                "layers on the pooled sentence embedding"
            )
    activation = str(cfg.get("activation_function") or "torch.nn.modules.activation.Tanh")
    short = activation.rsplit(".", 1)[-1]
    if not activation.startswith("torch.") or short not in _ACTIVATIONS:
        raise ConfigError(
            f"{directory}: Dense activation {activation} is not supported; Ember serves "
            f"torch.nn {', '.join(_ACTIVATIONS)}"
        )
    try:
        return DenseLayer(
            path=directory,
            in_features=int(cfg["in_features"]),
            out_features=int(cfg["out_features"]),
            bias=bool(cfg.get("bias", True)),
            activation=short,
            residual=bool(cfg.get("use_residual", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{directory}/config.json: no valid in/out_features: {exc}") from None


def pipeline_width(
    served_name: str,
    pooling: StPooling | None,
    modes: tuple[Pooling, ...],
    dense: tuple[DenseLayer, ...],
) -> int | None:
    """The width of what the pipeline returns (None: the encoder's), checking that each
    Dense takes what comes before it."""
    width = pooling.width * len(modes) if pooling and pooling.width else None
    for layer in dense:
        if width is not None and layer.in_features != width:
            raise ConfigError(
                f"{served_name}: Dense {layer.path.name} takes {layer.in_features} features "
                f"but {width} come before it"
            )
        width = layer.out_features
    return width


def st_prompts(root: Path) -> dict[str, str]:
    """config_sentence_transformers.json's prompts, by name."""
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    return {str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()}
