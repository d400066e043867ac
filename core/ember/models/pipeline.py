"""A transformer and what follows it (the whole model, or one Router route) read into a
``ResolvedModel``: the resolve step every transformer-pipeline family shares."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from ember.errors import ConfigError
from ember.models.facts import detect_task, max_length
from ember.models.spec import Pooling, ResolvedModel, Task
from ember.models.st_files import dense_layer, pipeline_width
from ember.outputs import DenseVectors, has

if TYPE_CHECKING:
    from ember.families.base import Family, ModelFiles

log = logging.getLogger(__name__)


def resolve_pipeline(files: ModelFiles, family: Family) -> ResolvedModel:
    spec, root, served_name, modules = files.spec, files.root, files.served_name, files.modules
    hf_dir = modules.transformer_dir
    config = files.config
    if spec.instruction is not None:
        log.warning("--instruction is for LLM rerankers; %s is not one: ignored", served_name)
    detected, num_labels, id2label = detect_task(config)
    task: Task = files.task
    if task in ("rerank", "classify") and detected == "embed":
        raise ConfigError(
            f"--task {task} needs a *ForSequenceClassification model; "
            f"{config.get('architectures')} is an encoder without a head"
        )
    if task == "embed" and detected != "embed":
        log.warning("serving classifier %s as an embedding model (--task embed)", served_name)
    st_pooling = modules.pooling
    modes: tuple[Pooling, ...] = (
        (spec.pooling,) if spec.pooling else st_pooling.modes if st_pooling else ()
    )
    if has(family.outputs, DenseVectors) and not modes:
        raise ConfigError(
            f"{served_name} has no sentence-transformers pooling config (1_Pooling/config.json); "
            "pass --pooling cls|mean|last|max so the vectors are not silently wrong"
        )
    # Dense layers after pooling belong to the dense head (ColBERT's are its own).
    dense = tuple(map(dense_layer, modules.dense)) if family.st_pipeline else ()
    width = pipeline_width(served_name, st_pooling, modes, dense)
    hidden = int(width or config.get("hidden_size") or config.get("d_model") or 0)
    st_cfg = files.st_config
    prompts = {str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()}
    adapters = task_adapters(config)
    if adapters and not prompts:  # the code's own instructions (jina's task_instructions)
        prompts = {str(k): str(v) for k, v in (config.get("task_instructions") or {}).items()}
    return ResolvedModel(
        spec=replace(spec, task=task),
        path=hf_dir,
        served_name=served_name,
        task=task,
        architecture=(config.get("architectures") or ["?"])[0],
        model_type=str(config.get("model_type", "")),
        hidden_size=hidden,
        max_length=max_length(root, hf_dir, config),
        pooling=modes[0] if modes else "cls",
        normalize=modules.normalize,
        num_labels=num_labels,
        id2label=id2label,
        prompts=prompts,
        default_prompt_name=st_cfg.get("default_prompt_name"),
        config=config,
        family=family,
        root=root,
        pooling_modes=modes if len(modes) > 1 else (),
        include_prompt=st_pooling.include_prompt if st_pooling else True,
        dense_layers=dense,
        task_adapters=adapters,
    )


def task_adapters(config: dict) -> dict[str, int]:
    """LoRA task adapters a remote-code model selects in its own forward: config.json's
    ``lora_adaptations`` (jina-embeddings-v3), each task's id its index, as its code's
    ``_adaptation_map`` numbers them."""
    names = config.get("lora_adaptations") if "auto_map" in config else None
    return {str(name): index for index, name in enumerate(names or ())}
