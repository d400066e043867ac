"""How one model's embed inputs, texts or token ids, become the job that tokenises them.

What a request may ask of its text sits here, apart from the engine's batching and
finishing: the model's prompts (and the positions a model that pools without its prompt
skips), the side (query or document) and a Router's side prompt, a jina-v3 prompt's LoRA
task adapter, vLLM's ``truncate_prompt_tokens`` and the server's token-id policy. Every
check raises before any tokenising is spent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from ember.errors import BadRequest
from ember.models.spec import ResolvedModel
from ember.processors import TextProcessor
from ember.processors.text import Direction, TextTokenizer

Job = Callable[[], list]


def _with_adapter(job: Job, adapter: int) -> list:
    """``job``'s tokens, each to run through the model's LoRA task adapter ``adapter``."""
    return [replace(t, adapter=adapter) for t in job()]


def _skip_prompt(encode: Job, skip: int, processor: Any, direction: Direction) -> list:
    """Inputs that pool from past their prompt's ``skip`` positions (leading special tokens
    included). Truncation from the left cuts the prompt first: only what is left of it is
    skipped, the leading special tokens always."""
    tokens = encode()
    if direction != "left":
        return [replace(t, pool_from=skip) for t in tokens]
    lead = processor.leading_specials
    return [
        replace(t, pool_from=max(lead, skip - (t.truncated_from or len(t)) + len(t)))
        for t in tokens
    ]


class TextInputs:
    """One loaded model's text inputs: built at start, once its processor is known."""

    def __init__(
        self, model: ResolvedModel, processor: TextProcessor, *, accept_token_ids: bool
    ) -> None:
        self.model = model
        self.processor = processor
        self.accept_token_ids = accept_token_ids
        # Per prompt name, the positions its prompt takes: only for a model whose Pooling
        # leaves the prompt out (include_prompt false); empty otherwise.
        self.prompt_positions: dict[str, int] = {}
        if not model.include_prompt and isinstance(processor, TextTokenizer):
            self.prompt_positions = {
                name: processor.prompt_length(prefix)
                for name, prefix in model.prompts.items()
                if prefix
            }

    def job(
        self,
        items: Sequence[str] | Sequence[Sequence[int]],
        *,
        truncate: bool,
        direction: Direction,
        prompt_name: str | None,
        query: bool | None,
        max_tokens: int | None,
    ) -> Job:
        """The tokenising job for ``items``, each option checked first."""
        processor = self.processor
        if items and not isinstance(items[0], str):
            if not self.accept_token_ids:
                raise BadRequest(
                    "this server takes text, not token ids (--no-accept-token-ids): send the "
                    "text itself (LangChain: OpenAIEmbeddings(..., "
                    "check_embedding_ctx_length=False))",
                    param="input",
                )
            if max_tokens is not None:
                return partial(self._limited(max_tokens), items, direction=direction)
            return partial(processor.from_ids, items, truncate=truncate, query=query)
        if processor.encodes_queries and prompt_name in ("query", "document"):
            query = prompt_name == "query"  # the side; a Router applies its prompt too
            if not (processor.side_prompts and prompt_name in self.model.prompts):
                prompt_name = None
        texts = self.with_prompt(list(items), prompt_name)  # type: ignore[arg-type]
        if max_tokens is not None:
            job: Job = partial(self._limited(max_tokens), texts, direction=direction)
        else:
            job = partial(
                processor.encode, texts, truncate=truncate, direction=direction, query=query
            )
        named = prompt_name or self.model.default_prompt_name or ""
        skip = self.prompt_positions.get(named)
        if skip:  # the model pools without its prompt's tokens
            job = partial(_skip_prompt, job, skip, processor, direction)
        adapter = self.model.task_adapters.get(named)
        if adapter is not None:  # the prompt names a task: its LoRA adapter too
            job = partial(_with_adapter, job, adapter)
        return job

    def with_prompt(self, texts: list[str], prompt_name: str | None) -> list[str]:
        """``texts`` with the named prompt (else the model's default one) in front."""
        prompts = self.model.prompts
        name = prompt_name or self.model.default_prompt_name
        if name is None:
            return texts
        if name not in prompts:
            raise BadRequest(
                f"prompt_name {name!r} is not one of this model's prompts "
                f"{sorted(prompts) or '(none)'}",
                param="prompt_name",
            )
        prefix = prompts[name]
        return [prefix + t for t in texts] if prefix else texts

    def _limited(self, max_tokens: int) -> Callable[..., list]:
        """``TextTokenizer.within`` at ``max_tokens`` (-1: the model's max), checked."""
        processor = self.processor
        limit = processor.max_length if max_tokens == -1 else max_tokens
        if not 1 <= limit <= processor.max_length:
            raise BadRequest(
                f"truncate_prompt_tokens {max_tokens} is outside 1..{processor.max_length} "
                f"(this model's max length; -1 means it)",
                param="truncate_prompt_tokens",
            )
        if type(processor) is not TextTokenizer:  # ColBERT, Router, media: their own cuts
            raise BadRequest(
                f"truncate_prompt_tokens is for text models with one tokenizer; model "
                f"{self.model.served_name!r} ({self.model.family.name}) cuts its inputs its "
                "own way: send truncate instead",
                param="truncate_prompt_tokens",
            )
        return partial(processor.within, limit=limit)
