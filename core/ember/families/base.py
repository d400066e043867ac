"""What a model family is: the one place that says how a kind of model is detected,
what it is (its facts), and what processes, heads, scores and runs it.

A family is a ``Family`` row declared in its own package of this package
(``ember.families.<name>``) and listed once in ``ember.families.registry.FAMILIES``; the resolver,
the engine, the API, ``/v1/models``, backend choice, export and the errors read the row
(and a model's ``facts``), and no module outside this package names a family
(tests/unit/test_families.py checks it). Rows pickle by name (``ember.families``
registers how).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ember.capabilities import (
    MODALITY_NOUNS,
    OUTPUT_NOUNS,
    Backbone,
    Capability,
    Modality,
    Output,
    Scoring,
)
from ember.errors import BadRequest, ConfigError
from ember.models.spec import ModelSpec, Task
from ember.outputs import MultiVectors, SparseVectors, embeds, has, output_type

if TYPE_CHECKING:
    from ember.backends.base import Backend
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel
    from ember.models.st_files import StModules
    from ember.processors import TextProcessor

# Backends, by their registry names (ember.backend_table).
NETWORK_BACKENDS = ("torch", "onnx", "ct2", "neuron")


@dataclass(frozen=True)
class ModelFiles:
    """What detection reads: a model directory's sentence-transformers modules, and its
    transformer's config.json when a family asks for it (read once, checked for remote
    code as it is read)."""

    spec: ModelSpec
    root: Path
    served_name: str
    modules: StModules
    # Resolves a pipeline inside this model (a Router's route) as a model of its own:
    # (its directory, its modules as (type, directory) pairs, the file that lists them,
    # its served name) -> the model its family resolves (ember.families.resolve).
    resolve_part: Callable[[Path, list[tuple[str, Path]], Path, str], ResolvedModel]

    @cached_property
    def config(self) -> dict:
        from ember.models.remote_code import check_remote_code
        from ember.models.st_files import read_json

        directory = self.modules.transformer_dir
        config = read_json(directory / "config.json")
        if config is None:
            raise ConfigError(f"{directory} has no config.json; is it a transformers model?")
        check_remote_code(config, self.served_name, self.spec.trust_remote_code)
        return config

    @cached_property
    def st_config(self) -> dict:
        from ember.models.st_files import read_json

        return read_json(self.root / "config_sentence_transformers.json") or {}

    @cached_property
    def task(self) -> Task:
        """The task asked for, else the one config.json's architecture has."""
        from ember.models.facts import detect_task

        return self.spec.task or detect_task(self.config)[0]

    @property
    def towers(self) -> bool:
        """Whether config.json has a vision or audio tower (a media model's)."""
        return "vision_config" in self.config or "audio_config" in self.config

    def has(self, *names: str) -> bool:
        return all((self.root / name).exists() for name in names)


@dataclass(frozen=True)
class MediaFacts:
    """How a media family's network and processor load, and where its processor differs."""

    net_class: str = "AutoModel"  # the transformers class its network loads with
    processor_class: str = "AutoProcessor"
    pads_text: bool = False  # text padded to the max length, as SigLIP's processor documents
    # Texts through the processor's ``process_queries`` and images through its
    # ``process_images`` (ColPali's and ColQwen2's one text and image paths): the query
    # path, built from (the processor, the max length, the text cut); None: no such path.
    queries: Callable[[Any, int, Any], Any] | None = None
    flat_patches: bool = False  # 2-D patch rows concatenated across images (Qwen2-VL's)
    text_position_offset: int = 0  # a RoBERTa text tower's positions start after padding


@dataclass(frozen=True)
class TableFacts:
    """A static family's table: the tensor names it is read from and how a text uses it."""

    weights: tuple[str, ...]  # the first present is the table
    mean: bool  # a text's vector is the mean of its rows (else: a weight per id present)
    # Where the tokenizer stops: tokenizer.json's own truncation (StaticEmbedding), or
    # transformers' ``truncation=True`` at model_max_length (SparseStaticEmbedding).
    truncates_at_model_max: bool = False


@dataclass(frozen=True)
class Condition:
    """A backend that runs a family's models only when their files say so: what the
    backend cannot compute for the others (ct2 takes lengths, not a mask). The README's
    cell, the start-up refusal and ``--backend auto`` all read it."""

    backend: str
    words: str  # the condition, in the README's words ("query expansion attended or off")
    met: Callable[[ResolvedModel], bool]  # whether a model's files meet it
    why: str  # what a model that fails it asks of the backend, for the refusal


Heads = Callable[["ResolvedModel"], "dict[Output, Head]"]
Processor = Callable[["ResolvedModel", "int | None"], "TextProcessor"]


@dataclass(frozen=True)
class Family:
    """One kind of model, declared once. ``detect`` is asked in FAMILIES order (the first
    family whose files match serves the model); ``resolve`` reads its facts into a
    ``ResolvedModel``; ``heads`` and ``processor`` build what the engine runs around the
    backend; ``backends`` are the ones that can run its network (auto's choice on a CPU
    first where it is measured faster: ``cpu_backend``)."""

    name: str  # as /v1/models' ``kind`` and the errors say it
    title: str  # in the README's words
    backbone: Backbone
    outputs: tuple[Output, ...]  # the heads it has, its default embedding first
    detect: Callable[[ModelFiles], bool]
    resolve: Callable[[ModelFiles, Family], ResolvedModel]
    heads: Heads
    processor: Processor
    detected_by: str  # the README's "detected by"
    example: str  # a checkpoint of the family, for the README
    backends: tuple[str, ...] = NETWORK_BACKENDS
    cpu_backend: str = "onnx"  # what auto picks on a CPU with onnxruntime (else torch)
    scoring: Scoring | None = None
    classifies: bool = False
    task: Task = "embed"  # the coarse task of --task and /info (embed, rerank, classify)
    # Whether `ember export` can write it: an export holds the network and the files of a
    # dense, rerank or classify model, not the heads (projections, MLM head) beside it.
    exportable: bool = True
    # What its inputs may hold; every family reads text, media ones images or audio too.
    modalities: tuple[Modality, ...] = ("text",)
    # What a rerank request's ``instruction`` is for this family, in its own words (an LLM
    # reranker's prompt; --help and the API docs list them); None: it takes none.
    instruction: str | None = None
    # A sentence-transformers Transformer + Pooling (+ Dense, Normalize) pipeline: its Dense
    # layers belong to the dense head, and an export writes the pipeline's files.
    st_pipeline: bool = False
    routable: bool = False  # may be a route of a sentence-transformers Router
    media: MediaFacts | None = None
    table: TableFacts | None = None
    # How a model made of parts (``facts.parts``: a Router's routes) loads: its own backend
    # over its parts', each loaded by the loader it is given (ember.backends.load_backend);
    # None: the backend chosen for its one network.
    load: Callable[[ResolvedModel, Callable[[ResolvedModel], Backend]], Backend] | None = None
    # A sentence-transformers module after the Transformer that the family reads its score
    # from (its type's name, and what the family calls such a model, for refusals).
    score_module: tuple[str, str] | None = None
    # Backends of ``backends`` that run a model of it only when its files meet a condition.
    conditions: tuple[Condition, ...] = ()

    def __repr__(self) -> str:
        return f"Family({self.name!r})"

    @property
    def instructed(self) -> bool:
        """Whether a rerank request may carry an ``instruction``."""
        return self.instruction is not None

    @property
    def only_backend(self) -> str | None:
        """The backend that alone runs it, if one does."""
        return self.backends[0] if len(self.backends) == 1 else None

    def runs_on(self, backend: str) -> bool:
        return backend in self.backends

    def condition(self, backend: str) -> Condition | None:
        """What a model must meet for ``backend`` to run it; None: nothing beyond the row."""
        return next((c for c in self.conditions if c.backend == backend), None)

    def unmet(self, model: ResolvedModel, backend: str) -> Condition | None:
        """The condition of ``backend`` that ``model``'s files fail, if one does."""
        condition = self.condition(backend)
        return condition if condition is not None and not condition.met(model) else None

    def require_condition(self, model: ResolvedModel, backend: str) -> None:
        """Refuse, in one line, a backend whose condition the model fails."""
        if (condition := self.unmet(model, backend)) is None:
            return
        others = [b for b in self.backends if b != backend and self.unmet(model, b) is None]
        instead = f"use --backend {' or '.join(others)} or auto" if others else "no backend runs it"
        raise ConfigError(
            f"model {model.served_name!r} is a {self.name} model, which --backend {backend} "
            f"runs only with {condition.words}: {condition.why}; {instead}"
        )

    @property
    def embedding(self) -> Output | None:
        """What /v1/embeddings returns: the model's first embedding output."""
        return next((o for o in self.outputs if embeds(o)), None)

    @property
    def capabilities(self) -> list[Capability]:
        caps: list[Capability] = []
        if self.embedding is not None:  # /v1/embeddings serves it (Infinity lists any)
            caps.append("embed")
        if has(self.outputs, SparseVectors):
            caps.append("embed_sparse")
        if has(self.outputs, MultiVectors):
            caps.append("embed_multi")
        if "image" in self.modalities:
            caps.append("image_embed")
        if "audio" in self.modalities:
            caps.append("audio_embed")
        if self.scoring is not None:
            caps.append("rerank")
        if self.classifies:
            caps.append("classify")
        return caps

    def does(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def serves(self) -> str:
        """What this kind serves, in words, for error messages."""
        parts = [output_type(o).words for o in self.outputs if embeds(o)]
        if len(self.modalities) > 1:
            parts = [
                f"{p} of {' and '.join(MODALITY_NOUNS[m] for m in self.modalities)}" for p in parts
            ]
        if self.scoring is not None:
            parts.append(f"reranking ({self.scoring})")
        if self.classifies:
            parts.append("classification")
        return ", ".join(parts)

    def require_output(self, output: Output, model_name: str) -> None:
        if output not in self.outputs:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) has no {OUTPUT_NOUNS[output]} head; "
                f"it serves {self.serves()}",
                param="model",
            )

    def require_modality(
        self, modality: Modality, model_name: str, param: str = "modality"
    ) -> None:
        if modality not in self.modalities:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not take {modality} input; it "
                f"serves {self.serves()}",
                param=param,
            )

    def require_scoring(self, model_name: str) -> Scoring:
        if self.scoring is None:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not rerank; it serves {self.serves()}",
                param="model",
            )
        return self.scoring

    def require_instruction(self, model_name: str) -> None:
        if not self.instructed:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) takes no instruction; `instruction` is "
                "for LLM rerankers",
                param="instruction",
            )

    def require_classify(self, model_name: str) -> None:
        if not self.classifies:
            raise BadRequest(
                f"model {model_name!r} ({self.name}) does not classify; it serves {self.serves()}",
                param="model",
            )


def plain(task: Task) -> Callable[[ModelFiles], bool]:
    """``detect`` of a plain family, by the task alone (asked last: no media towers)."""

    def detect(files: ModelFiles) -> bool:
        return files.task == task and not files.towers

    return detect


def never(files: ModelFiles) -> bool:
    """``detect`` of a family another one's resolve picks (a Router's sparse row)."""
    return False


def lazy(module: str, name: str) -> Callable[..., Any]:
    """A hook imported when first called: families load no processor, tokenizer or head
    library until a model of theirs is served."""

    def call(*args: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(module), name)(*args)

    call.__qualname__ = f"{module}.{name}"
    return call
