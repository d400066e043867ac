"""A CrossEncoder that sentence-transformers 6.2 saves over a causal LM: modules.json's
``Transformer(transformer_task="text-generation")`` then ``LogitScore``. Each (query,
document) pair becomes ``query``/``document`` chat messages rendered by the tokenizer's own
chat template; the score is ``logit[true] - logit[false]`` at the last position (or
``logit[true]`` alone), then the CrossEncoder's ``activation_fn``.

Read here from the saved files and checked against what Ember reproduces exactly (the
prompt in ``prompt.py`` beside this, the two LM-head rows in ``ember.backends.torch_causal``);
anything else in the layout is refused at start with what and why, never served with a
different score.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ember.errors import ConfigError
from ember.models.score_activation import saved_activation
from ember.models.spec import Facts, ScoreActivation
from ember.models.st_files import read_json

log = logging.getLogger(__name__)

MessageFormat = Literal["flat", "structured", "auto"]

# Transformer's module_output_name for text-generation, which LogitScore reads.
CAUSAL_LOGITS = "causal_logits"
# sentence_bert_config.json keys the scores do not depend on: how the model loads or pads
# (FlashAttention unpadding), and the per-task lengths a CrossEncoder never asks for.
_HARMLESS_KEYS = ("unpad_inputs", "query_length", "document_length", "module_output_name")
# processing_kwargs["text"] keys that do not change a pair's ids: how the batch pads,
# and how many positions' logits come back (LogitScore reads the last one either way).
_PADDING_KEYS = ("padding", "pad_to_multiple_of", "logits_to_keep")
_SIZE_KEYS = ("max_length", "truncation")
# model_kwargs that change how the network runs, not what it computes.
_MODEL_KEYS = ("dtype", "torch_dtype", "attn_implementation", "device_map")
# Files that make AutoProcessor load a multimodal processor instead of the tokenizer.
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
FAMILY = "a sentence-transformers causal-LM CrossEncoder (Transformer + LogitScore)"


@dataclass(frozen=True)
class ChatReranker(Facts):
    """The family's facts: what serving a LogitScore CrossEncoder needs: its answer
    tokens' ids (true first; the rows of the LM head every runtime computes), the prompt
    it is served with (the saved default prompt, ``--instruction``'s, or None), how its
    pairs are rendered and cut, and its saved activation."""

    token_ids: tuple[int, ...]
    prompt: str | None
    message_format: MessageFormat
    # apply_chat_template's own kwargs (processing_kwargs["chat_template"] less the size
    # keys and sentence-transformers' restore_suffix).
    chat_kwargs: dict[str, Any] = field(default_factory=dict)
    max_length: int | None = None  # where the rendered prompt is cut; None: not cut
    truncation_side: Literal["right", "left"] = "right"
    restore_suffix: bool = True  # the template's tail written back over a cut prompt
    activation: ScoreActivation = "sigmoid"
    name: str = "sentence-transformers LogitScore"

    @property
    def rerank_activation(self) -> ScoreActivation:
        return self.activation

    @property
    def answer_tokens(self) -> tuple[int, ...]:
        return self.token_ids

    @property
    def network_name(self) -> str:
        return self.name


def _refuse(where: Path, what: str, why: str) -> ConfigError:
    return ConfigError(
        f"{where}: {what}; {why} (Ember serves {FAMILY} as sentence-transformers 6.2 saves it)"
    )


def _logit_score(directory: Path, vocab_size: int) -> tuple[int, ...]:
    cfg = read_json(directory / "config.json")
    if not isinstance(cfg, dict):
        raise ConfigError(
            f"modules.json names a LogitScore module; {directory}/config.json is missing"
        )
    name = cfg.get("module_input_name", CAUSAL_LOGITS)
    if name != CAUSAL_LOGITS:
        raise _refuse(
            directory,
            f"LogitScore reads {name!r}",
            f"Ember scores the causal LM's own {CAUSAL_LOGITS!r}",
        )
    ids = []
    for key in ("true_token_id", "false_token_id"):
        value = cfg.get(key)
        if value is None and key == "false_token_id":
            continue  # the true token's logit alone
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
            raise _refuse(
                directory,
                f"LogitScore {key} {value!r} is not a token id",
                f"the LM's vocabulary has ids 0..{vocab_size - 1}",
            )
        ids.append(value)
    return tuple(ids)


def _processing(st: dict, where: Path) -> tuple[dict, int | None, object, bool]:
    """processing_kwargs as Transformer.preprocess merges them: the chat-template kwargs,
    the max length and truncation they ask for (chat-template bucket first, then text,
    then common), and restore_suffix."""
    kwargs = st.get("processing_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _refuse(where, f"processing_kwargs {kwargs!r}", "it is not an object")
    for bucket in ("audio", "image", "video"):
        if kwargs.get(bucket):
            raise _refuse(
                where, f"processing_kwargs[{bucket!r}] is set", "Ember renders text pairs only"
            )
    text = dict(kwargs.get("text") or {})
    common = dict(kwargs.get("common") or {})
    common.pop("return_tensors", None)
    chat = dict(kwargs.get("chat_template") or {})
    for bucket, values in (("text", text), ("common", common)):
        unknown = [k for k in values if k not in (*_PADDING_KEYS, *_SIZE_KEYS)]
        if unknown:
            raise _refuse(
                where,
                f"processing_kwargs[{bucket!r}] sets {', '.join(unknown)}",
                "Ember reproduces the cut (max_length, truncation) and padding of a "
                "pair's prompt, not other tokenizer options",
            )
    restore = bool(chat.pop("restore_suffix", True))
    for key in ("padding", "return_tensors"):  # hoisted to the tokenizer: the ids stay
        chat.pop(key, None)
    for key in ("return_dict", "tokenize", "tokenizer_kwargs"):
        if key in chat:
            raise _refuse(
                where,
                f"processing_kwargs['chat_template'] sets {key}",
                "Ember tokenises the rendered prompt itself",
            )
    sizes = {k: chat.pop(k) for k in _SIZE_KEYS if k in chat}
    # preprocess' text default; common's truncation never reaches the tokenizer past it
    truncation = sizes.get("truncation", text.get("truncation", "longest_first"))
    max_length = sizes.get("max_length", text.get("max_length", common.get("max_length")))
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)):
        raise _refuse(where, f"processing_kwargs max_length {max_length!r}", "not an integer")
    return chat, max_length, truncation, restore


def _tokenizer_length(st: dict, hf_dir: Path, config: dict, where: Path) -> int | None:
    """The tokenizer's model_max_length as Transformer sets it: ``max_seq_length`` (or
    processor_kwargs' model_max_length) as given, else tokenizer_config.json's capped at
    max_position_embeddings; None where it is unbounded (transformers' huge default)."""
    processor = dict(st.get("processor_kwargs") or st.get("tokenizer_args") or {})
    unknown = [k for k in processor if k != "model_max_length"]
    if unknown:
        raise _refuse(
            where,
            f"processor_kwargs sets {', '.join(unknown)}",
            "Ember loads the saved tokenizer as it is",
        )
    given = processor.get("model_max_length") or st.get("max_seq_length")
    if given is not None:
        return int(given)
    declared = (read_json(hf_dir / "tokenizer_config.json") or {}).get("model_max_length")
    positions = config.get("max_position_embeddings")
    lengths = [
        int(v) for v in (declared, positions) if isinstance(v, (int, float)) and 0 < v < 10**12
    ]
    return min(lengths) if lengths else None


def _message_format(st: dict, where: Path) -> MessageFormat:
    modality = st.get("modality_config") or {}
    if "message" not in modality:
        raise _refuse(
            where,
            "the Transformer has no message modality (no chat template)",
            "Ember renders pairs as query/document chat messages only",
        )
    extra = [m for m in modality if m not in ("text", "message")]
    if extra:
        raise _refuse(
            where, f"the Transformer takes {', '.join(extra)} input", "Ember serves text pairs"
        )
    fmt = (
        modality["message"].get("format", "auto")
        if isinstance(modality["message"], dict)
        else "auto"
    )
    if fmt not in ("flat", "structured", "auto"):
        raise _refuse(
            where, f"message format {fmt!r}", "sentence-transformers has flat and structured"
        )
    return fmt


def _check_st_keys(st: dict, where: Path) -> None:
    if st.get("transformer_task") != "text-generation":
        raise _refuse(
            where,
            f"transformer_task {st.get('transformer_task')!r} before LogitScore",
            "LogitScore scores a text-generation Transformer",
        )
    if st.get("module_output_name", CAUSAL_LOGITS) != CAUSAL_LOGITS:
        raise _refuse(
            where,
            f"module_output_name {st['module_output_name']!r}",
            f"LogitScore reads {CAUSAL_LOGITS!r}",
        )
    if st.get("do_lower_case"):
        raise _refuse(where, "do_lower_case is set", "Ember tokenises as the tokenizer does")
    if st.get("query_expansion"):
        raise _refuse(where, "query_expansion is set", "it rewrites a query's padding")
    model_kwargs = dict(st.get("model_kwargs") or st.get("model_args") or {})
    config_kwargs = dict(st.get("config_kwargs") or st.get("config_args") or {})
    changed = [k for k in model_kwargs if k not in _MODEL_KEYS] + list(config_kwargs)
    if changed:
        raise _refuse(
            where,
            f"the Transformer loads with {', '.join(changed)}",
            "Ember loads the saved network as it is",
        )
    known = {
        "transformer_task",
        "modality_config",
        "processing_kwargs",
        "max_seq_length",
        "do_lower_case",
        "query_expansion",
        "processor_kwargs",
        "tokenizer_args",
        "model_kwargs",
        "model_args",
        "config_kwargs",
        "config_args",
        *_HARMLESS_KEYS,
    }
    unknown = sorted(set(st) - known)
    if unknown:
        raise _refuse(
            where,
            f"sentence_bert_config.json sets {', '.join(unknown)}",
            "Ember does not know what they change",
        )


def chat_reranker(
    root: Path,
    hf_dir: Path,
    logit_dir: Path,
    config: dict,
    instruction: str | None,
    trust_remote_code: bool,
) -> ChatReranker:
    """The LogitScore CrossEncoder in ``root``, checked; ``instruction`` (``--instruction``)
    replaces its default prompt, as ``CrossEncoder.predict(prompt=...)`` does."""
    where = hf_dir / "sentence_bert_config.json"
    st = read_json(where) or {}
    _check_st_keys(st, where)
    for name in _PROCESSOR_FILES:
        if (hf_dir / name).exists():
            raise _refuse(
                hf_dir / name,
                "the model has a multimodal processor",
                "Ember renders text pairs through a tokenizer's chat template",
            )
    message_format = _message_format(st, where)
    chat, max_length, truncation, restore = _processing(st, where)
    cuts = bool(truncation) and truncation != "do_not_truncate"
    if cuts and max_length is None:
        max_length = _tokenizer_length(st, hf_dir, config, where)
    tok_cfg = read_json(hf_dir / "tokenizer_config.json") or {}
    side = tok_cfg.get("truncation_side", "right")
    st_cfg = read_json(root / "config_sentence_transformers.json") or {}
    prompts = st_cfg.get("prompts") or {}
    default = st_cfg.get("default_prompt_name")
    prompt = instruction if instruction is not None else prompts.get(default) if default else None
    vocab = int(config.get("vocab_size") or 0)
    return ChatReranker(
        token_ids=_logit_score(logit_dir, vocab),
        prompt=prompt or None,
        message_format=message_format,
        chat_kwargs=chat,
        max_length=max_length if cuts else None,
        truncation_side="left" if side == "left" else "right",
        restore_suffix=restore,
        activation=saved_activation(root, config, trust_remote_code),
    )
