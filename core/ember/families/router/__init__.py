"""A sentence-transformers Router: queries and documents through routes of their own (a
StaticEmbedding or IDF query side, a transformer document side), picked by input_type /
prompt_name as ColBERT's sides are. Each route is resolved as the model its own files
make it (its family's); the Router's row is the one for the embedding its routes return.

The whole family is this package: the rows and their resolve here, its facts (``Routes``:
the routes and the sides they take), its processor (``processor.py``: each input through
its route's tokenizer, the route in the batch's ``part``), heads (``heads.py``) and
backend (``backend.py``: each route on a backend of its own, loaded by the row's
``load`` hook)."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles, lazy
from ember.families.router.facts import Routes
from ember.models.spec import ResolvedModel
from ember.models.st_files import ROUTER, TABLE_MODULES, read_json, st_prompts
from ember.outputs import is_dense

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.processors import TextProcessor

_ROUTE_STARTS = ("Transformer", "MLMTransformer", *TABLE_MODULES)


def _route_mappings(raw: dict, path: Path) -> dict[tuple[Any, Any], str]:
    """router_config.json's ``route_mappings``: keys as Router.save wrote them,
    ``str((task, modality))``."""
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


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """sentence-transformers' Router: each route resolved as a model of its own; a query
    takes the route Router._resolve_route gives task "query" for text, a document the
    one for "document", an input marked as neither the one for no task (its default)."""
    spec, root, served_name, modules = files.spec, files.root, files.served_name, files.modules
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
        routes[route] = files.resolve_part(
            directory / ids[0], entries, path, f"{served_name}[{route}]"
        )
    outputs = {r: m.family.embedding for r, m in routes.items()}
    for route, m in routes.items():
        if m.task != "embed" or not m.family.routable:
            raise ConfigError(
                f"{path}: route {route!r} is a {m.family.name} pipeline; Ember serves Router "
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
    if is_dense(output) and len(set(widths.values())) > 1:
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
        default_prompt_name=files.st_config.get("default_prompt_name"),
        family=next(f for f in ROUTERS if f.outputs == (output,)),
        root=root,
        pooling_modes=first.pooling_modes,
        facts=Routes(routes, query, document, unmarked),
    )


def heads(model: ResolvedModel) -> dict[Output, Head]:
    """Each route's heads, built from its own files; one RoutedHead per output."""
    from ember.families.router.heads import RoutedHead
    from ember.heads.build import build_heads

    assert isinstance(model.facts, Routes)
    routes = model.facts.models
    built = {name: build_heads(sub) for name, sub in routes.items()}
    normalized = frozenset(name for name, sub in routes.items() if sub.normalize)
    return {
        output: RoutedHead(output, {r: heads[output] for r, heads in built.items()}, normalized)
        for output in model.family.outputs
    }


def processor(model: ResolvedModel, max_length: int | None) -> TextProcessor:
    from ember.families.router.processor import RouterProcessor

    return RouterProcessor(model, max_length)


def _detect(files: ModelFiles) -> bool:
    return files.modules.start == ROUTER


_COMMON: dict[str, Any] = {
    "backbone": "routes",
    "detect": _detect,
    "resolve": resolve,
    "heads": heads,
    "processor": processor,
    "load": lazy("ember.families.router.backend", "load_routes"),
    "exportable": False,
}

ROUTER_DENSE = Family(
    name="router",
    title="Router",
    outputs=("dense",),
    detected_by="a sentence-transformers `Router` (`router_config.json`): a query route and a "
    "document route, each Transformer + Pooling or StaticEmbedding",
    example="a `Router.for_query_document(...)` save (static query side, MiniLM documents)",
    **_COMMON,
)
ROUTER_SPARSE = Family(
    name="sparse-router",
    title="sparse Router",
    outputs=("sparse",),
    detected_by="a `SparseEncoder` `Router`: an IDF query route (`SparseStaticEmbedding`) and "
    "a SPLADE document route",
    example="opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill",
    **_COMMON,
)
ROUTERS = (ROUTER_DENSE, ROUTER_SPARSE)
