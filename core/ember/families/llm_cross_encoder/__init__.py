"""A CrossEncoder that sentence-transformers 6.2 builds over a causal LM
(``CrossEncoder("Qwen/Qwen3-0.6B")``) and saves as modules.json's text-generation
``Transformer`` then ``LogitScore``: each pair rendered by the tokenizer's chat template as
``query``/``document`` messages, scored ``logit[true] - logit[false]`` at the last
position (or ``logit[true]``), then its ``activation_fn``.

Everything of the family is in this package: the row below (detection: the registry
hands ``st_files`` this row's ``score_module``, so modules.json's LogitScore arrives as
``files.modules.score``), its facts (``layout.ChatReranker``, read and checked from the
files), its processor (``prompt.ChatRerankTokenizer``). Shared machinery it only uses: the
answer-token head (``ember.heads.dense``) and the answer-token network every runtime loads
when a model's facts name answer tokens (``ember.backends.torch_causal``: two rows of the
LM head, not the vocabulary). It runs where that network does: torch under auto (long
prompts, as the LLM rerankers'), onnx when asked; ct2 and neuron run encoders."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles, lazy
from ember.families.llm_cross_encoder.layout import chat_reranker
from ember.models.spec import ResolvedModel

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head

SCORE_MODULE = "LogitScore"


def _detect(files: ModelFiles) -> bool:
    score = files.modules.score
    return score is not None and score[0] == SCORE_MODULE


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """The network the causal LM's; prompt, cut, answer tokens and activation its
    CrossEncoder's."""
    spec, config, hf_dir = files.spec, files.config, files.modules.transformer_dir
    assert files.modules.score is not None
    logit_dir = files.modules.score[1]
    if spec.task not in (None, "rerank") or spec.pooling is not None:
        asked = f"--task {spec.task}" if spec.task not in (None, "rerank") else "--pooling"
        raise ConfigError(
            f"{files.served_name} is a sentence-transformers CrossEncoder (Transformer + "
            f"LogitScore): it reranks, and {asked} asks for what its files do not hold; drop "
            f"{asked}"
        )
    archs = config.get("architectures") or [""]
    reranker = chat_reranker(
        files.root, hf_dir, logit_dir, config, spec.instruction, spec.trust_remote_code
    )
    positions = int(config.get("max_position_embeddings") or 0)
    return ResolvedModel(
        spec=replace(spec, task="rerank"),
        path=hf_dir,
        served_name=files.served_name,
        task="rerank",
        architecture=str(archs[0]),
        model_type=str(config.get("model_type", "")),
        hidden_size=int(config.get("hidden_size") or 0),
        max_length=reranker.max_length or positions,
        pooling="last",  # unused: the backend reads each input's last position itself
        normalize=False,
        num_labels=1,
        config=config,
        family=family,
        root=files.root,
        facts=reranker,
    )


def heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.dense import AnswerTokensHead

    return {"logits": AnswerTokensHead()}


LLM_CROSS_ENCODER = Family(
    name="llm-cross-encoder",
    title="LLM CrossEncoder (LogitScore)",
    backbone="causal-lm",
    outputs=("logits",),
    detect=_detect,
    resolve=resolve,
    heads=heads,
    processor=lazy("ember.families.llm_cross_encoder.prompt", "ChatRerankTokenizer"),
    detected_by="modules.json: a `text-generation` `Transformer`, then `LogitScore` "
    "(sentence-transformers ≥ 6.2 `CrossEncoder` over a `*ForCausalLM`)",
    example='a `CrossEncoder("Qwen/Qwen3-0.6B")` saved by sentence-transformers 6.2',
    backends=("torch", "onnx"),
    cpu_backend="torch",
    scoring="llm",
    task="rerank",
    exportable=False,
    instruction="an LLM CrossEncoder's system prompt",
    score_module=(SCORE_MODULE, "causal-LM CrossEncoder (Transformer + LogitScore)"),
)
