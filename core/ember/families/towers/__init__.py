"""Dual-tower media models: CLIP and SigLIP (a text and an image tower into one space),
CLAP (text and audio). Every input goes through the model's own transformers processor;
their vectors are compared by cosine, so they come back normalised (as Infinity's)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ember.capabilities import Modality
from ember.errors import ConfigError
from ember.families.base import Family, MediaFacts, ModelFiles, lazy
from ember.models.spec import ResolvedModel

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head


def resolve_media(files: ModelFiles, family: Family) -> ResolvedModel:
    """Width and text max length from config.json: a tower's projection, or a retrieval
    VLM's ``embedding_dim`` and its language model's positions."""
    spec, served_name, config = files.spec, files.served_name, files.config
    assert family.media is not None
    if spec.task not in (None, "embed"):
        raise ConfigError(f"--task {spec.task}: {served_name} is a {family.name} embedding model")
    text = config.get("text_config") or {}
    if family.backbone == "retrieval-vlm":
        width = config.get("embedding_dim") or config.get("dim") or 128
        vlm = config.get("vlm_config") or {}
        inner = vlm.get("text_config") or vlm
        positions = int(inner.get("max_position_embeddings") or 8192)
    else:
        width = (
            config.get("projection_dim") or text.get("projection_size") or text.get("hidden_size")
        )
        positions = int(text.get("max_position_embeddings") or 77)
    return ResolvedModel(
        spec=replace(spec, task="embed"),
        path=files.modules.transformer_dir,
        served_name=served_name,
        task="embed",
        architecture=(config.get("architectures") or ["?"])[0],
        model_type=str(config.get("model_type", "")),
        hidden_size=int(width or 0),
        max_length=positions - family.media.text_position_offset,
        pooling="cls",  # unused: the towers pool inside the model
        normalize=True,
        config=config,
        family=family,
        root=files.root,
    )


def tower_heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.media import TowerHead

    return {"dense": TowerHead()}


def model_type_is(*types: str) -> Any:
    """``detect`` by config.json's model_type, as Infinity tells media models apart."""

    def detect(files: ModelFiles) -> bool:
        return files.modules.start is None and files.config.get("model_type") in types

    return detect


TEXT_IMAGE: tuple[Modality, ...] = ("text", "image")
TEXT_AUDIO: tuple[Modality, ...] = ("text", "audio")
# What every media family shares: its own processor, and no `ember export`.
MEDIA: dict[str, Any] = {
    "resolve": resolve_media,
    "processor": lazy("ember.processors.media", "build_media_processor"),
    "exportable": False,
}
_TOWERS: dict[str, Any] = {**MEDIA, "backbone": "dual-encoder", "heads": tower_heads}

CLIP = Family(
    name="clip",
    title="CLIP",
    outputs=("dense",),
    detect=model_type_is("clip"),
    detected_by="`model_type` `clip` (a `vision_config`); also as sentence-transformers saves "
    "it (6.x's `Transformer`, or the `CLIPModel` module of clip-ViT-B-32)",
    example="openai/clip-vit-base-patch32",
    backends=("torch", "onnx"),
    modalities=TEXT_IMAGE,
    media=MediaFacts(),
    **_TOWERS,
)
# SigLIP stays on torch under auto: at base size the two were within the noise, ORT's
# optimizer not fusing its vision attention (ember.backends.choice).
SIGLIP = Family(
    name="siglip",
    title="SigLIP",
    outputs=("dense",),
    detect=model_type_is("siglip", "siglip2"),
    detected_by="`model_type` `siglip`, `siglip2` (a `vision_config`)",
    example="google/siglip-base-patch16-224",
    backends=("torch", "onnx"),
    cpu_backend="torch",
    modalities=TEXT_IMAGE,
    media=MediaFacts(pads_text=True),
    **_TOWERS,
)
CLAP = Family(
    name="clap",
    title="CLAP",
    outputs=("dense",),
    detect=model_type_is("clap"),
    detected_by="`model_type` `clap` (an `audio_config`)",
    example="laion/clap-htsat-unfused",
    backends=("torch",),
    modalities=TEXT_AUDIO,
    media=MediaFacts(text_position_offset=2),  # a RoBERTa text tower
    **_TOWERS,
)
TOWERS = (CLIP, SIGLIP, CLAP)
