"""Typed values that describe a model: what the user asked for, and what was found."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ember.backend_settings import FORWARD_NICE, BackendSettings
from ember.lanes import WEIGHTS
from ember.outputs import Activation

if TYPE_CHECKING:
    from ember.capabilities import Backbone
    from ember.families.base import Family
    from ember.media.limits import MediaLimits

Task = Literal["embed", "rerank", "classify"]
SparseActivation = Literal["relu", "log1p_relu"]
# What a reranker's relevance_score is of its logit: sigmoid, or the logit itself (a
# CrossEncoder saved with activation_fn Identity).
ScoreActivation = Literal["sigmoid", "none"]
# sentence-transformers' Pooling modes (``last`` is its ``lasttoken``, ``mean_sqrt_len`` its
# ``mean_sqrt_len_tokens``); POOLINGS are the ones ``--pooling`` offers.
Pooling = Literal["cls", "mean", "last", "max", "mean_sqrt_len", "weightedmean"]
TASKS: tuple[Task, ...] = ("embed", "rerank", "classify")
POOLINGS: tuple[Pooling, ...] = ("cls", "mean", "last", "max")


# Batching and queue defaults: the settings (ember.config) and ModelSpec both read these.
MAX_BATCH_TOKENS = 8192
MAX_BATCH_SIZE = 32
MAX_QUEUE_SIZE = 4096
REQUEST_TIMEOUT = 60.0


@dataclass(frozen=True)
class ModelSpec:
    """One served model as configured (CLI flags / EMBER_* env / Python kwargs)."""

    model_id: str
    served_model_name: str | None = None
    task: Task | None = None  # None: detect from the model's files
    backend: str = "auto"  # see ember.backends.choice
    device: str = "auto"
    dtype: str = "auto"
    near_exact_check: str = "start"  # or "background" (ember.backends.near_exact.settle)
    pooling: Pooling | None = None  # None: from 1_Pooling/config.json
    embedding_dtype: str = "float32"  # what /v1/embeddings answers dense vectors in
    revision: str | None = None
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_batch_size: int = MAX_BATCH_SIZE
    max_queue_size: int = MAX_QUEUE_SIZE
    request_timeout: float = REQUEST_TIMEOUT
    lane_weights: tuple[float, float, float] = WEIGHTS  # interactive, default, bulk
    bulk_batch_tokens: int | None = None  # a bulk batch's padded cost cap; None: by device
    accept_token_ids: bool = True  # token-id input on /v1/embeddings (--accept-token-ids)
    forward_workers: int = 0  # 0: auto (see ember.cpu.cpu_forward_plan)
    forward_nice: int = FORWARD_NICE  # forward threads' nice increment (ember.cpu)
    torch_compile: bool = False  # torch backend: torch.compile while loading
    trust_remote_code: bool = False
    cache_dir: Path | None = None  # where exported artifacts (onnx, ct2) are kept
    # neuron, when compiling and loading (None: the setting's default, ember.config)
    neuron_batch_size: int | None = None
    neuron_sequence_lengths: tuple[int, ...] | None = None  # None: defaults, capped
    neuron_auto_cast: str | None = None  # none|matmul|all; None: not cast (float32)
    neuron_cores: int | None = None  # None: the count given at export, else the visible
    media: MediaLimits | None = None  # fetching and decoding limits; None: the defaults
    instruction: str | None = None  # an LLM reranker's; None: its family's default


@dataclass(frozen=True)
class DenseLayer:
    """A sentence-transformers ``Dense`` module after pooling, as its config.json says;
    the heads read its weights from ``path`` (``linear.weight``/``linear.bias``)."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # the torch.nn class name: Identity, Tanh, ReLU, Sigmoid
    residual: bool = False  # use_residual: the input (or its projection) is added


@dataclass(frozen=True)
class Facts:
    """A family's own facts: one typed value per model (``ResolvedModel.facts``), a
    subclass declared in the family's package (``ember.families.<name>``). What shared
    machinery may ask of any model's facts is declared here, with the answer of a family
    that has nothing to say; the base itself is the facts of a family with none."""

    @property
    def rerank_activation(self) -> ScoreActivation:
        """What a reranker's relevance_score is of its logit (its saved activation_fn)."""
        return "sigmoid"

    @property
    def label_activation(self) -> Activation:
        """What turns a classifier's logits into label scores (its problem_type)."""
        return "softmax"

    @property
    def answer_tokens(self) -> tuple[int, ...]:
        """The network every runtime loads: the causal LM scored by only these rows of its
        LM head at each input's last real position (ember.backends.torch_causal); empty:
        the network as it is."""
        return ()

    @property
    def network_name(self) -> str:
        """What the answer-token network is, for a runtime that refuses one."""
        return ""

    @property
    def parts(self) -> tuple[ResolvedModel, ...]:
        """The models of their own this one is made of, each loaded on a backend of its
        own (a sentence-transformers Router's routes; ``Family.load`` puts them
        together); empty: the model is one network."""
        return ()


NO_FACTS = Facts()


@dataclass(frozen=True)
class ResolvedModel:
    """A model's files on disk plus everything read from them; input to a backend.

    ``path`` is the transformer's directory (what a backend loads), ``root`` the model's
    own (where sentence-transformers and head files live). ``family`` is the model's
    family (``ember.families``), ``facts`` what only that family reads (its own type).
    """

    spec: ModelSpec
    path: Path
    served_name: str
    task: Task
    architecture: str
    model_type: str
    hidden_size: int
    max_length: int
    pooling: Pooling
    normalize: bool
    family: Family
    num_labels: int = 0
    id2label: dict[int, str] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    config: dict = field(default_factory=dict)
    root: Path | None = None
    # The rest of a sentence-transformers pipeline between the transformer and Normalize:
    # every Pooling mode when it concatenates several (its order; empty: just ``pooling``),
    # whether prompt tokens are pooled, and the Dense layers (``hidden_size`` is the last
    # one's width).
    pooling_modes: tuple[Pooling, ...] = ()
    include_prompt: bool = True
    dense_layers: tuple[DenseLayer, ...] = ()
    # A remote-code model's LoRA task adapters (jina-embeddings-v3's lora_adaptations): the
    # id its forward takes as adapter_mask, by task name, each also a prompt name.
    task_adapters: dict[str, int] = field(default_factory=dict)
    facts: Facts = NO_FACTS  # the family's own facts (ember.families.<name>)
    # What a backend is told of the settings (built from ``spec`` here, once): backends
    # read this, never ``spec``.
    runtime: BackendSettings = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runtime", BackendSettings.of(self.spec))
        if self.root is None:
            object.__setattr__(self, "root", self.path)

    def on_backend(
        self, backend: str, device: str | None = None, dtype: str | None = None
    ) -> ResolvedModel:
        """This model as loaded on ``backend`` (and ``device``, ``dtype``, if given): what
        the loader hands the backend it picked for ``auto`` (or auto's near-exact path),
        or the one a family alone runs on."""
        spec = replace(
            self.spec,
            backend=backend,
            device=device or self.spec.device,
            dtype=dtype or self.spec.dtype,
        )
        return replace(self, spec=spec)

    @property
    def poolings(self) -> tuple[Pooling, ...]:
        return self.pooling_modes or (self.pooling,)

    @property
    def rerank_activation(self) -> ScoreActivation:
        return self.facts.rerank_activation

    @property
    def activation(self) -> Activation:
        """A classifier's label activation (softmax, sigmoid per label, or none)."""
        return self.facts.label_activation

    @property
    def backbone(self) -> Backbone:
        return self.family.backbone

    @property
    def device(self) -> str:
        return self.spec.device

    @property
    def dtype(self) -> str:
        return self.spec.dtype
