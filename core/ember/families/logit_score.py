"""A CrossEncoder that sentence-transformers 6.2 builds over a causal LM
(``CrossEncoder("Qwen/Qwen3-0.6B")``) and saves as modules.json's text-generation
``Transformer`` then ``LogitScore``: each pair rendered by the tokenizer's chat template as
``query``/``document`` messages, scored ``logit[true] - logit[false]`` at the last
position (or ``logit[true]``), then its ``activation_fn``. What the layout says is read
and checked in ``ember.models.logit_score``; the prompt is built in
``ember.processors.chat_rerank``.

Its network is the LLM rerankers' (``ember.backends.torch_causal``: two rows of the LM
head, not the vocabulary), so it runs where they do: torch under auto (their long-prompt
reasoning, ``ember.families.llm_reranker``), onnx when asked; ct2 runs encoders."""

from __future__ import annotations

from dataclasses import replace

from ember.errors import ConfigError
from ember.families.base import Family, ModelFiles, lazy
from ember.families.llm_reranker import heads
from ember.models.logit_score import chat_reranker
from ember.models.spec import ResolvedModel


def _detect(files: ModelFiles) -> bool:
    return files.modules.logit_score is not None


def resolve(files: ModelFiles, family: Family) -> ResolvedModel:
    """The network the causal LM's; prompt, cut, answer tokens and activation its
    CrossEncoder's."""
    spec, config, hf_dir = files.spec, files.config, files.modules.transformer_dir
    logit_dir = files.modules.logit_score
    assert logit_dir is not None
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
        activation="sigmoid",
        rerank_activation=reranker.activation,
        config=config,
        family=family,
        root=files.root,
        llm=reranker,
    )


LLM_CROSS_ENCODER = Family(
    name="llm-cross-encoder",
    title="LLM CrossEncoder (LogitScore)",
    backbone="causal-lm",
    outputs=("logits",),
    detect=_detect,
    resolve=resolve,
    heads=heads,
    processor=lazy("ember.processors.chat_rerank", "ChatRerankTokenizer"),
    detected_by="modules.json: a `text-generation` `Transformer`, then `LogitScore` "
    "(sentence-transformers ≥ 6.2 `CrossEncoder` over a `*ForCausalLM`)",
    example='a `CrossEncoder("Qwen/Qwen3-0.6B")` saved by sentence-transformers 6.2',
    backends=("torch", "onnx"),
    cpu_backend="torch",
    scoring="llm",
    task="rerank",
    exportable=False,
    instructed=True,
)
