"""sentence-transformers' StaticEmbedding (static-retrieval-mrl-en-v1, model2vec models):
the mean of a vector per token id; and SparseStaticEmbedding (the IDF query side of the
OpenSearch inference-free sparse models): a weight per token id present. No network: the
numpy backend alone serves them, with no torch or ONNX Runtime import."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles, TableFacts
from ember.models.spec import ResolvedModel
from ember.models.st_files import StPooling, dense_layer, pipeline_width, read_json, st_prompts

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.processors import TextProcessor

# What a static model reads when its tokenizer truncates nothing: sentence-transformers'
# StaticEmbedding has no maximum (``max_seq_length`` is inf); a table lookup per token
# costs so little that a long text needs no limit of Ember's either.
STATIC_MAX_LENGTH = 1 << 20


def _tokenizer_length(directory: Path, family: Family) -> int:
    """Where a static module's tokenizer stops (TableFacts.truncates_at_model_max)."""
    assert family.table is not None
    if family.table.truncates_at_model_max:
        declared = (read_json(directory / "tokenizer_config.json") or {}).get("model_max_length")
        if isinstance(declared, (int, float)) and 0 < declared < STATIC_MAX_LENGTH:
            return int(declared)
        return STATIC_MAX_LENGTH
    tokenizer = read_json(directory / "tokenizer.json")
    if not isinstance(tokenizer, dict):
        raise ConfigError(f"{directory} has no tokenizer.json, which a {family.name} model reads")
    truncation = tokenizer.get("truncation") or {}
    return int(truncation.get("max_length") or STATIC_MAX_LENGTH)


def _width(directory: Path, family: Family) -> int:
    """The table's width (a mean's embedding_dim; one weight per vocabulary id), from the
    safetensors header where there is one."""
    from ember.models.weights import checkpoint_files, read_checkpoint

    assert family.table is not None
    names, mean = family.table.weights, family.table.mean
    files = checkpoint_files(directory)
    if files[0].suffix == ".safetensors":
        from safetensors import safe_open

        for file in files:
            with safe_open(str(file), framework="numpy") as f:
                for name in names:
                    if name in f.keys():
                        shape = f.get_slice(name).get_shape()
                        return int(shape[-1] if mean else shape[0])
    else:  # a torch pickle: read as transformers would (ember.models.weights)
        for table in read_checkpoint(directory, names).values():
            return int(table.shape[-1] if mean else table.shape[0])
    raise ConfigError(
        f"{directory}: none of {', '.join(names)} in the weights of a {family.name} model"
    )


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """No transformer and no config.json: the module's own directory holds its tokenizer
    and table, then the pipeline's Dense and Normalize."""
    spec, served_name, modules = files.spec, files.served_name, files.modules
    assert family.table is not None
    if spec.task not in (None, "embed"):
        raise ConfigError(f"--task {spec.task}: {served_name} is a {family.name} embedding model")
    if spec.pooling:
        raise ConfigError(
            f"--pooling {spec.pooling}: {served_name} is a {family.name} model, which "
            "averages its token vectors itself; leave --pooling out"
        )
    directory = modules.transformer_dir
    width = _width(directory, family)
    dense = tuple(map(dense_layer, modules.dense))
    if dense and not family.table.mean:
        raise ConfigError(
            f"{served_name}: a Dense module after a {family.name} table is not supported"
        )
    width = pipeline_width(served_name, StPooling(("mean",), width), ("mean",), dense) or width
    return ResolvedModel(
        spec=replace(spec, task="embed"),
        path=directory,
        served_name=served_name,
        task="embed",
        architecture=str(modules.start),
        model_type="",
        hidden_size=width,
        max_length=_tokenizer_length(directory, family),
        pooling="mean",
        normalize=modules.normalize,
        prompts=st_prompts(files.root),
        default_prompt_name=files.st_config.get("default_prompt_name"),
        family=family,
        root=files.root,
        dense_layers=dense,
    )


def processor(model: ResolvedModel, max_length: int | None) -> TextProcessor:
    """Its own tokenizer without special tokens, as sentence-transformers takes them."""
    from ember.processors.text import TextTokenizer

    return TextTokenizer(model, max_length, special_tokens=False)


def mean_heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.build import projection
    from ember.heads.dense import PooledHead

    return {"dense": PooledHead(tuple(map(projection, model.dense_layers)))}


def weight_heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.sparse import VocabularyWeightsHead

    return {"sparse": VocabularyWeightsHead()}


# What both tables share: no network, numpy alone, no export, a Router route.
_TABLES: dict[str, Any] = {
    "backbone": "token-table",
    "resolve": resolve,
    "processor": processor,
    "backends": ("numpy",),
    "exportable": False,
    "routable": True,
}

STATIC = Family(
    name="static",
    title="static embedding",
    outputs=("dense",),
    detect=lambda files: files.modules.start == "StaticEmbedding",
    heads=mean_heads,
    detected_by="a `StaticEmbedding` (model2vec's `embeddings`/`mapping`/`weights` folded in)",
    example="sentence-transformers/static-retrieval-mrl-en-v1",
    table=TableFacts(weights=("embedding.weight", "embeddings"), mean=True),
    **_TABLES,
)

SPARSE_STATIC = Family(
    name="sparse-static",
    title="sparse static embedding",
    outputs=("sparse",),
    detect=lambda files: files.modules.start == "SparseStaticEmbedding",
    heads=weight_heads,
    detected_by="a `SparseStaticEmbedding` (an IDF weight per token id)",
    example="opensearch-neural-sparse-encoding-doc-v3-distill's query route",
    table=TableFacts(weights=("weight",), mean=False, truncates_at_model_max=True),
    **_TABLES,
)
