"""LLM rerankers (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma): a causal LM with
its prompt template around each pair, scored by its answer tokens' logits at the last
position. The templates, instructions and answer tokens of each are ``templates.py`` (its
facts, ``LlmReranker``), the prompt around each pair ``prompt.py``; the template lives in
Ember, so no `ember export`. The answer-token head (``ember.heads.dense``) and network
(``ember.backends.torch_causal``) are shared machinery, read from the facts.

torch serves them under auto on every device: their prompts run to 8,192 tokens, and the
exported graph's unfused attention holds a [heads, T, T] score matrix per layer where
torch's SDPA kernel does not (ember.backends.choice); onnx serves them when asked, and for
``--dtype int8`` (torch has no int8)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy
from ember.families.llm_reranker import templates
from ember.models.facts import max_length
from ember.models.spec import ResolvedModel

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head


def _reranker(files: ModelFiles) -> templates.LlmTemplate | None:
    if files.modules.start is not None:
        return None
    config = files.config
    names = templates.model_names(files.spec.model_id, files.root, config)
    pooled = files.modules.pooling is not None or files.spec.pooling is not None
    return templates.detect(config, names, files.spec.task, pooled, files.served_name)


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """The network the LM's; template, instruction and answer tokens its reranker's."""
    reranker = _reranker(files)
    assert reranker is not None
    spec, config, hf_dir = files.spec, files.config, files.modules.transformer_dir
    return ResolvedModel(
        spec=replace(spec, task="rerank"),
        path=hf_dir,
        served_name=files.served_name,
        task="rerank",
        architecture=reranker.architecture,
        model_type=reranker.model_type,
        hidden_size=int(config.get("hidden_size") or 0),
        max_length=max_length(files.root, hf_dir, config),
        pooling="last",  # unused: the backend reads each input's last position itself
        normalize=False,
        num_labels=1,
        config=config,
        family=family,
        root=files.root,
        facts=templates.llm_reranker(reranker, hf_dir, spec.instruction),
    )


def heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.dense import AnswerTokensHead

    return {"logits": AnswerTokensHead()}


LLM_RERANKER = Family(
    name="llm-reranker",
    title="LLM reranker",
    backbone="causal-lm",
    outputs=("logits",),
    detect=lambda files: _reranker(files) is not None,
    resolve=resolve,
    heads=heads,
    processor=lazy("ember.families.llm_reranker.prompt", "LlmRerankTokenizer"),
    detected_by="`Qwen3ForCausalLM`, `Qwen2ForCausalLM`, `GemmaForCausalLM` with no pooling "
    "config, named `…qwen3-reranker…`, `…mxbai-rerank…`, `…bge-reranker-v2-gemma…` (or "
    "`--task rerank`)",
    example="Qwen/Qwen3-Reranker-0.6B",
    backends=("torch", "onnx"),
    cpu_backend="torch",
    scoring="llm",
    task="rerank",
    exportable=False,
    instruction="Qwen3-Reranker's `<Instruct>`, mxbai-rerank-v2's instruction line, "
    "bge-reranker-v2-gemma's prompt",
)
