"""Typed values that describe a model: what the user asked for, and what was found."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ember.outputs import Activation

if TYPE_CHECKING:
    from ember.capabilities import Backbone
    from ember.families.base import Family
    from ember.media.limits import MediaLimits
    from ember.models.llm_rerankers import LlmReranker
    from ember.models.logit_score import ChatReranker

Task = Literal["embed", "rerank", "classify"]
SparseActivation = Literal["relu", "log1p_relu"]
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
FORWARD_NICE = 10


@dataclass(frozen=True)
class ModelSpec:
    """One served model as configured (CLI flags / EMBER_* env / Python kwargs)."""

    model_id: str
    served_model_name: str | None = None
    task: Task | None = None  # None: detect from the model's files
    backend: str = "auto"  # see ember.backends.choice
    device: str = "auto"
    dtype: str = "auto"
    pooling: Pooling | None = None  # None: from 1_Pooling/config.json
    embedding_dtype: str = "float32"  # what /v1/embeddings answers dense vectors in
    revision: str | None = None
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_batch_size: int = MAX_BATCH_SIZE
    max_queue_size: int = MAX_QUEUE_SIZE
    request_timeout: float = REQUEST_TIMEOUT
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
class Routes:
    """A sentence-transformers ``Router``: each route's pipeline resolved as a model of its
    own, by route name, and the route a query, a document and an input marked as neither
    take (as ``Router._resolve_route`` resolves them for text; None: no route for that
    side)."""

    models: dict[str, ResolvedModel]
    query: str | None
    document: str | None
    default: str


@dataclass(frozen=True)
class ResolvedModel:
    """A model's files on disk plus everything read from them; input to a backend.

    ``path`` is the transformer's directory (what a backend loads), ``root`` the model's
    own (where sentence-transformers and head files live). ``family`` is the model's
    family (``ember.families``); left out, the plain one of ``task``.
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
    num_labels: int = 0
    id2label: dict[int, str] = field(default_factory=dict)
    activation: Activation = "softmax"  # a classifier's, from config.json's problem_type
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    config: dict = field(default_factory=dict)
    family: Family = None  # type: ignore[assignment]  # None: set from task below
    root: Path | None = None
    # The rest of a sentence-transformers pipeline between the transformer and Normalize:
    # every Pooling mode when it concatenates several (its order; empty: just ``pooling``),
    # whether prompt tokens are pooled, and the Dense layers (``hidden_size`` is the last
    # one's width).
    pooling_modes: tuple[Pooling, ...] = ()
    include_prompt: bool = True
    dense_layers: tuple[DenseLayer, ...] = ()
    # SpladePooling's activation: relu, or OpenSearch's log1p_relu (log1p applied twice).
    sparse_activation: SparseActivation = "relu"
    # A sentence-transformers Router's routes, each a model of its own (None: no Router).
    routes: Routes | None = None
    # A remote-code model's LoRA task adapters (jina-embeddings-v3's lora_adaptations): the
    # id its forward takes as adapter_mask, by task name, each also a prompt name.
    task_adapters: dict[str, int] = field(default_factory=dict)
    # An LLM reranker's template, instruction and answer tokens (ember.models.llm_rerankers),
    # or a causal-LM CrossEncoder's chat template and answer tokens (ember.models.logit_score).
    llm: LlmReranker | ChatReranker | None = None
    # What a reranker's relevance_score is of its logit: sigmoid, or the logit itself (a
    # CrossEncoder saved with activation_fn Identity).
    rerank_activation: Literal["sigmoid", "none"] = "sigmoid"

    def __post_init__(self) -> None:
        if self.family is None:
            from ember.families import for_task

            object.__setattr__(self, "family", for_task(self.task))
        if self.root is None:
            object.__setattr__(self, "root", self.path)

    @property
    def poolings(self) -> tuple[Pooling, ...]:
        return self.pooling_modes or (self.pooling,)

    @property
    def backbone(self) -> Backbone:
        return self.family.backbone

    @property
    def device(self) -> str:
        return self.spec.device

    @property
    def dtype(self) -> str:
        return self.spec.dtype
