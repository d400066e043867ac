"""A sentence-transformers causal-LM CrossEncoder's prompt per (query, document) pair, as
its ``Transformer.preprocess`` builds it (sentence-transformers 6.2):

- the pair becomes ``query`` and ``document`` messages (``InputFormatter.pair_to_messages``),
  after a ``system`` message holding the prompt when there is one, their content a string
  (``flat``) or ``[{"type": "text", ...}]`` (``structured``), as the saved message format
  or the template says;
- the tokenizer's own ``apply_chat_template`` renders and tokenises them, with the saved
  chat-template kwargs: the ids are the reference's, control tokens in a text included;
- a prompt longer than the max length is cut on the tokenizer's truncation side, and the
  template's tail (``_chat_template_suffix_ids``: the common token suffix of two renders
  with different fillers) written back over its last tokens, so the last position is the
  template's, not the document's.

sentence-transformers pads on the left and reads the last position; Ember pads on the
right and reads each input's last real position (``ember.backends.torch_causal``): the
same logits, since a rotary model's attention depends on positions' differences only.
"""

from __future__ import annotations

from typing import Any

from ember.batch import Tokens
from ember.errors import BadRequest, ConfigError
from ember.families.llm_cross_encoder.layout import ChatReranker
from ember.models.spec import ResolvedModel
from ember.processors.text import TextTokenizer

# InputFormatter's: model types whose templates take flat content, and the template text
# that says content is a list of typed parts.
_FLAT_MODEL_TYPES = ("apertus", "deepseek_v3", "gpt_oss", "seed_oss")
_STRUCTURED_PATTERNS = ("content[0]", ".type", "'type'", '"type"', "item.type", "message.content[")
# PAIR_ROLE_PROBES: a baseline pair, then one varying only the query, one only the document.
_PROBES = (("alpha", "bravo"), ("charlie", "bravo"), ("alpha", "foxtrot"))
_FILLERS = ("0", "1 2 3 4")  # _chat_template_suffix_ids' two renders
_SUFFIX_CACHE = 256


class ChatRerankTokenizer(TextTokenizer):
    """``encode_pairs`` renders each pair through the model's chat template; a request's
    ``instruction`` is the prompt (``CrossEncoder.predict(prompt=...)``) in place of the
    model's. ``max_length`` is where a prompt is cut (or, uncut, what the network takes)."""

    def __init__(self, model: ResolvedModel, max_length: int | None = None) -> None:
        super().__init__(model, max_length)
        facts = model.facts
        assert isinstance(facts, ChatReranker)
        self.facts = facts
        self.cuts = facts.max_length is not None
        self._hf = _chat_tokenizer(model)
        self.flat = _is_flat(facts, model.model_type, self._hf.chat_template)
        self._tails: dict[str | None, list[int]] = {}
        self._check_pair_roles(model.served_name)

    def _message(self, role: str, text: str) -> dict[str, Any]:
        content: Any = text if self.flat else [{"type": "text", "text": text}]
        return {"role": role, "content": content}

    def _conversation(self, query: str, document: str, prompt: str | None) -> list[dict]:
        head = [self._message("system", prompt)] if prompt else []
        return [*head, self._message("query", query), self._message("document", document)]

    def _render(self, conversations: list[list[dict]], tokenize: bool = True) -> list[Any]:
        """apply_chat_template as sentence-transformers calls it, uncut and unpadded."""
        out = self._hf.apply_chat_template(
            conversations,
            tokenize=tokenize,
            return_dict=tokenize,
            padding=False,
            truncation=False,
            **self.facts.chat_kwargs,
        )
        return [list(ids) for ids in out["input_ids"]] if tokenize else list(out)

    def _check_pair_roles(self, served_name: str) -> None:
        """``_verify_pair_roles_supported``: a template that drops the query or the document
        renders every pair alike, which sentence-transformers refuses to score."""
        try:
            base, *varied = self._render(
                [self._conversation(q, d, None) for q, d in _PROBES], tokenize=False
            )
        except Exception as exc:  # the template's own error, named at start
            raise ConfigError(
                f"{served_name}: its chat template cannot render a query/document pair: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        roles = zip(("query", "document"), varied, strict=True)
        dropped = [role for role, text in roles if text == base]
        if dropped:
            raise ConfigError(
                f"{served_name}: the {' and '.join(dropped)} content does not reach the chat "
                "template's prompt, so every pair would score alike (sentence-transformers "
                "refuses it too); save the CrossEncoder with a template that renders the "
                "'query' and 'document' roles"
            )

    def _tail(self, prompt: str | None) -> list[int]:
        """The template's tail after the document: the longest common token suffix of the
        pair rendered with two fillers (the system prompt kept), empty when they never
        differ."""
        if prompt in self._tails:
            return self._tails[prompt]
        first, second = self._render([self._conversation(f, f, prompt) for f in _FILLERS])
        count = 0
        for left, right in zip(reversed(first), reversed(second), strict=False):
            if left != right:
                break
            count += 1
        suffix = first[len(first) - count :] if 0 < count < min(len(first), len(second)) else []
        if len(self._tails) >= _SUFFIX_CACHE:
            self._tails.pop(next(iter(self._tails)))
        self._tails[prompt] = suffix
        return suffix

    def encode_pairs(
        self,
        pairs: list[tuple[str, str]],
        *,
        truncate: bool = True,
        instruction: str | None = None,
    ) -> list[Tokens]:
        """One prompt per pair, rendered in one call."""
        prompt = instruction if instruction is not None else self.facts.prompt
        rendered = self._render([self._conversation(q, d, prompt) for q, d in pairs])
        return [self._prompt(ids, truncate, prompt) for ids in rendered]

    def _prompt(self, ids: list[int], truncate: bool, prompt: str | None) -> Tokens:
        limit, full = self.max_length, len(ids)
        if full > limit and not (truncate and self.cuts):
            how = "send truncate=true or shorten them" if self.cuts else "shorten them"
            raise BadRequest(
                f"query and document take {full} tokens in this model's chat template, more "
                f"than it keeps (at most {limit}); {how}",
                param="documents",
            )
        if full > limit:
            ids = ids[-limit:] if self.facts.truncation_side == "left" else ids[:limit]
        if self.cuts and self.facts.restore_suffix and len(ids) >= limit:
            suffix = self._tail(prompt)
            keep = min(len(suffix), len(ids))
            if keep:
                ids = ids[: len(ids) - keep] + suffix[len(suffix) - keep :]
        return Tokens(ids, [0] * len(ids), truncated_from=full if full > limit else None)


def _chat_tokenizer(model: ResolvedModel) -> Any:
    """The processor sentence-transformers loads (AutoProcessor), which must be a tokenizer
    with a chat template."""
    try:
        from transformers import AutoProcessor, PreTrainedTokenizerBase
    except ImportError:
        raise ConfigError(
            f"{model.served_name}: a causal-LM CrossEncoder renders pairs with transformers' "
            "chat templates: pip install 'ember[torch]'"
        ) from None
    processor = AutoProcessor.from_pretrained(str(model.path))
    if not isinstance(processor, PreTrainedTokenizerBase):
        raise ConfigError(
            f"{model.served_name}: its processor is a {type(processor).__name__}, not a "
            "tokenizer; Ember renders text pairs through a tokenizer's chat template"
        )
    if not processor.chat_template:
        raise ConfigError(
            f"{model.served_name}: its tokenizer has no chat template, which a causal-LM "
            "CrossEncoder renders its pairs with"
        )
    return processor


def _is_flat(facts: ChatReranker, model_type: str, template: Any) -> bool:
    """The message format saved with the model, else ``InputFormatter._infer_format``'s."""
    if facts.message_format != "auto":
        return facts.message_format == "flat"
    if model_type in _FLAT_MODEL_TYPES:
        return True
    if not isinstance(template, str) or not template:
        return False
    return not any(pattern in template for pattern in _STRUCTURED_PATTERNS)
