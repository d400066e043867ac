"""LLM rerankers: causal LMs that score a (query, document) pair by the logits of their
answer tokens at the last position of a prompt template.

Each template is one row of ``TEMPLATES``: its architecture, the answer tokens, the default
instruction and length budget of the reference that documents it (the model card, or the
model's own package), and what a model id that names it contains. The prompt each builds is
in ``prompt.py`` beside this; backends compute only the answer tokens' rows of the LM
head (``ember.backends.torch_causal``), never the whole vocabulary (151,669 rows for
Qwen3-Reranker, 256,000 for Gemma).

A causal LM's files do not say that it reranks (Qwen3-Reranker-0.6B and Qwen3-0.6B have the
same config and tokenizer), so a template is served when the model id names it or
``--task rerank`` asks for it; any other causal LM of these architectures without a pooling
config is refused with both ways to serve it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ember.errors import ConfigError
from ember.models.spec import Facts

log = logging.getLogger(__name__)

# Qwen3-Reranker's model card: the instruction when none is given.
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# FlagEmbedding's LLM reranker (BaseLLMReranker): the prompt when none is given.
FLAG_LLM_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to "
    "the query by providing a prediction of either 'Yes' or 'No'."
)


@dataclass(frozen=True)
class LlmTemplate:
    """One LLM reranker template, as its reference scores it.

    The score logit is ``logit(positive) - logit(negative)`` (a softmax over the two is the
    sigmoid of it), or ``logit(positive)`` alone where there is no negative token.
    ``max_length`` is the reference's default length budget (``prompt.py`` beside this
    says what it bounds in each template).
    """

    name: str
    architecture: str  # config.json architectures[0]
    model_type: str
    example: str  # a checkpoint of the template
    marker: str  # what a model id of the template contains (lowercase)
    positive: str
    negative: str | None
    instruction: str | None  # the default; None: the template has no instruction line
    max_length: int
    reference: str  # where the template and scoring are documented


TEMPLATES: tuple[LlmTemplate, ...] = (
    LlmTemplate(
        "qwen3-reranker",
        "Qwen3ForCausalLM",
        "qwen3",
        "Qwen/Qwen3-Reranker-0.6B",
        "qwen3-reranker",
        "yes",
        "no",
        QWEN3_INSTRUCTION,
        8192,
        "the Qwen3-Reranker model card",
    ),
    LlmTemplate(
        "mxbai-rerank-v2",
        "Qwen2ForCausalLM",
        "qwen2",
        "mixedbread-ai/mxbai-rerank-base-v2",
        "mxbai-rerank",
        "1",
        "0",
        None,
        8192,
        "the mxbai-rerank package (MxbaiRerankV2)",
    ),
    LlmTemplate(
        "bge-reranker-v2-gemma",
        "GemmaForCausalLM",
        "gemma",
        "BAAI/bge-reranker-v2-gemma",
        "bge-reranker-v2-gemma",
        "Yes",
        None,
        FLAG_LLM_PROMPT,
        512,
        "FlagEmbedding's FlagLLMReranker",
    ),
)


@dataclass(frozen=True)
class LlmReranker(Facts):
    """The family's facts: what serving one LLM reranker needs: its template, the
    instruction it is served with (``--instruction``, else the template's), and the ids of
    its answer tokens (positive first), the rows of the LM head every runtime computes."""

    template: LlmTemplate
    instruction: str | None
    token_ids: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.template.name

    @property
    def answer_tokens(self) -> tuple[int, ...]:
        return self.token_ids

    @property
    def network_name(self) -> str:
        return self.template.name


def _template_for(config: dict) -> LlmTemplate | None:
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    model_type = str(config.get("model_type", ""))
    for template in TEMPLATES:
        if template.architecture == arch and template.model_type == model_type:
            return template
    return None


def model_names(model_id: str, root: Path, config: dict) -> list[str]:
    """What a model is called, lowercase: its id, its directory (a hub cache's
    ``models--org--name`` above the snapshot), and the ``_name_or_path`` it was saved from."""
    names = [model_id, root.name, str(config.get("_name_or_path") or "")]
    if root.parent.name == "snapshots":
        names.append(root.parent.parent.name.replace("--", "/"))
    return [n.lower() for n in names if n]


def detect(
    config: dict, names: Sequence[str], task: str | None, pooled: bool, served_name: str
) -> LlmTemplate | None:
    """The LLM reranker template a model is, or None when it is not one.

    A causal LM of a template's architecture is that reranker when a name says so or
    ``--task rerank`` asks; served as an embedder with ``--task embed`` or a pooling
    config; refused otherwise, since its files cannot tell the two apart.
    """
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    if not arch.endswith("ForCausalLM") or task in ("embed", "classify") or pooled:
        return None
    template = _template_for(config)
    if template is None:
        if task == "rerank":
            known = ", ".join(f"{f.architecture} ({f.name})" for f in TEMPLATES)
            raise ConfigError(
                f"--task rerank: {served_name} is a {arch} ({config.get('model_type', '?')}), "
                f"a causal LM Ember has no reranker template for; LLM rerankers: {known}"
            )
        return None
    if task == "rerank" or any(template.marker in name for name in names):
        return template
    raise ConfigError(
        f"{served_name} is a {arch} without a sentence-transformers pooling config: an LLM "
        f"reranker or a decoder its files do not say; pass --task rerank to serve it as "
        f"{template.name} ({template.example}'s template), or --pooling last to embed with it"
    )


def answer_token_ids(template: LlmTemplate, tokenizer_dir: Path) -> tuple[int, ...]:
    """The ids of the template's answer tokens in the model's own tokenizer, each of which
    must be one token (as the reference takes the first id of its encoding)."""
    from tokenizers import Tokenizer

    file = tokenizer_dir / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(f"{tokenizer_dir} has no tokenizer.json; {template.name} needs one")
    tok = Tokenizer.from_file(str(file))
    ids = []
    for token in (template.positive, template.negative):
        if token is None:
            continue
        encoded = tok.encode(token, add_special_tokens=False).ids
        if len(encoded) != 1:
            raise ConfigError(
                f"{tokenizer_dir}: the tokenizer encodes {token!r} as {len(encoded)} tokens "
                f"({encoded}); {template.name} scores by it as one token: not a {template.name} "
                "tokenizer"
            )
        ids.append(encoded[0])
    return tuple(ids)


def llm_reranker(
    template: LlmTemplate, tokenizer_dir: Path, instruction: str | None
) -> LlmReranker:
    """The template with its answer tokens and the instruction it is served with."""
    log.info(
        "%s: LLM reranker %s, prompt and scoring of %s",
        tokenizer_dir,
        template.name,
        template.reference,
    )
    chosen = instruction if instruction is not None else template.instruction
    return LlmReranker(template, chosen, answer_token_ids(template, tokenizer_dir))
