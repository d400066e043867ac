"""The text processor: text -> token ids with the model's Rust tokenizer, and a batch
of them -> one right-padded ``TokenBatch``.

Runs on worker threads: ``encode_batch`` releases the GIL, so tokenising the next
request overlaps with the forward pass of the current batch. A single text longer than the
model can use is cut first (``ember.processors.cut``) and counted from its truncated
encoding, never tokenised whole or twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Encoding, Tokenizer

from ember.batch import TokenBatch, Tokens
from ember.errors import BadRequest, ConfigError
from ember.models.spec import ResolvedModel
from ember.processors.chunks import Tokenised
from ember.processors.cut import TextCut, encoded_length, longest_token_chars

Direction = Literal["right", "left"]
# Token-id input is read in the served model's own vocabulary. An id past its end almost
# always means a client tokenised with another one: LangChain's OpenAIEmbeddings counts
# and splits text with tiktoken's cl100k_base (ids up to 100,276) unless told not to.
FOREIGN_IDS_HINT = (
    ": the client likely tokenised with another vocabulary (tiktoken's cl100k_base, as "
    "LangChain's OpenAIEmbeddings does by default); send the text instead "
    "(LangChain: OpenAIEmbeddings(..., check_embedding_ctx_length=False))"
)


def collate(tokens: Sequence[Tokens], pad_id: int) -> TokenBatch:
    """Right-pad a batch of token lists into int64 arrays."""
    longest = max(len(t) for t in tokens)
    ids = np.full((len(tokens), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(tokens), longest), dtype=np.int64)
    types = np.zeros((len(tokens), longest), dtype=np.int64)
    lengths = np.empty(len(tokens), dtype=np.int64)
    custom_mask = False
    keep = tuple(t.keep for t in tokens)
    for row, tok in enumerate(tokens):
        n = len(tok)
        ids[row, :n] = tok.ids
        types[row, :n] = tok.type_ids
        lengths[row] = n
        if tok.attention is None:
            mask[row, :n] = 1
        else:
            mask[row, :n] = tok.attention
            custom_mask = True
    pool_from = np.array([t.pool_from for t in tokens], dtype=np.int64)
    spans = tuple(t.spans for t in tokens)
    return TokenBatch(
        ids,
        mask,
        types,
        lengths if custom_mask else None,
        keep if any(k is not None for k in keep) else None,
        pool_from if pool_from.any() else None,
        adapter=tokens[0].adapter,  # one per batch: Tokens.key keeps adapters apart
        spans=spans if any(s is not None for s in spans) else None,
    )


def load_tokenizer(path: Path) -> Tokenizer:
    file = path / "tokenizer.json"
    if file.exists():
        return Tokenizer.from_file(str(file))
    try:  # slow-tokenizer-only repos: let transformers build the fast one
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), use_fast=True).backend_tokenizer
    except Exception as exc:
        raise ConfigError(f"{path} has no usable tokenizer (tokenizer.json): {exc}") from exc


def declared_token_ids(tok: Tokenizer, path: Path, keys: Sequence[str]) -> dict[str, int]:
    """The ids of the special tokens the tokenizer config names (``mask_token``,
    ``unk_token``, ...), for each of ``keys`` it declares and the vocabulary holds."""
    declared: dict = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = path / name
        if file.exists():
            declared.update(json.loads(file.read_text(encoding="utf-8")))
    found = {}
    for key in keys:
        value = declared.get(key)
        token = value.get("content") if isinstance(value, dict) else value
        if isinstance(token, str) and tok.token_to_id(token) is not None:
            found[key] = int(tok.token_to_id(token))
    return found


class TextTokenizer:
    """Truncating and exact-length tokenisation, single texts and (query, doc) pairs.

    ``query`` is accepted and ignored: these models encode queries and documents alike.
    ``special_tokens`` False leaves out what the tokenizer's post-processor adds (``[CLS]``,
    ``[SEP]``), as sentence-transformers' StaticEmbedding tokenises.
    """

    encodes_queries = False
    masks_positions = False
    side_prompts = False

    def __init__(
        self, model: ResolvedModel, max_length: int | None = None, *, special_tokens: bool = True
    ) -> None:
        self.special_tokens = special_tokens
        base = load_tokenizer(model.path)
        base.no_padding()
        base.no_truncation()
        self.max_length = min(model.max_length, max_length or model.max_length)
        self._exact = base
        self._truncating = {
            direction: self._clone(base, self.max_length, direction)
            for direction in ("right", "left")
        }
        self.vocab_size = base.get_vocab_size(with_added_tokens=True)
        self._cut = TextCut(self.max_length, longest_token_chars(base))
        self.pad_id = self._pad_id(base, model)
        self._prefix, self._suffix = self._special_wrapping(base) if special_tokens else ([], [])
        self.leading_specials = len(self._prefix)  # [CLS]: what a left cut never removes

    @staticmethod
    def _clone(base: Tokenizer, max_length: int, direction: str) -> Tokenizer:
        tok = Tokenizer.from_str(base.to_str())
        tok.enable_truncation(max_length, direction=direction)
        return tok

    @staticmethod
    def _pad_id(tok: Tokenizer, model: ResolvedModel) -> int:
        pad = model.config.get("pad_token_id")
        if isinstance(pad, int):
            return pad
        for token in ("[PAD]", "<pad>", "<|endoftext|>"):
            found = tok.token_to_id(token)
            if found is not None:
                return found
        return 0

    @staticmethod
    def _special_wrapping(tok: Tokenizer) -> tuple[list[int], list[int]]:
        """Special tokens the post-processor puts around a text, for raw token-id input."""
        enc = tok.encode("a")
        content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
        if not content:
            return [], []
        return enc.ids[: content[0]], enc.ids[content[-1] + 1 :]

    def encode(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        direction: Direction = "right",
        query: bool | None = False,
    ) -> list[Tokens]:
        encodings, pieces = self._cut.encode(
            self._truncating[direction], texts, direction, self.special_tokens
        )
        return [
            self._checked(enc, text, truncate, len(piece) < len(text))
            for enc, text, piece in zip(encodings, texts, pieces, strict=True)
        ]

    def encode_pairs(self, pairs: list[tuple[str, str]], *, truncate: bool = True) -> list[Tokens]:
        encodings = self._truncating["right"].encode_batch(pairs)
        return [
            self._checked(enc, pair, truncate) for enc, pair in zip(encodings, pairs, strict=True)
        ]

    def _checked(
        self, enc: Encoding, original: str | tuple[str, str], truncate: bool, cut: bool = False
    ) -> Tokens:
        if not enc.overflowing:
            return Tokens(enc.ids, enc.type_ids)
        # A pair's overflow is per side (longest_first): count it by tokenising it whole.
        full = len(self._exact.encode(*original)) if isinstance(original, tuple) else None
        if full is None:
            full = encoded_length(enc)
        if not truncate:
            count = f"more than {full}" if cut else str(full)
            raise BadRequest(
                f"input has {count} tokens, more than this model's maximum of "
                f"{self.max_length}; send truncate=true or shorten it",
                param="input",
            )
        return Tokens(enc.ids, enc.type_ids, truncated_from=full)

    def from_ids(
        self, sequences: list[list[int]], *, truncate: bool = True, query: bool | None = False
    ) -> list[Tokens]:
        """Token-id input (OpenAI style): the model's special tokens are added around it."""
        out = []
        room = self.max_length - len(self._prefix) - len(self._suffix)
        for seq in sequences:
            self._check_vocabulary(seq, "input")
            full = len(seq) + len(self._prefix) + len(self._suffix)
            if len(seq) > room and not truncate:
                raise BadRequest(
                    f"input has {full} tokens, more than this model's maximum of {self.max_length}",
                    param="input",
                )
            ids = self._prefix + list(seq[:room]) + self._suffix
            out.append(Tokens(ids, [0] * len(ids), full if len(seq) > room else None))
        return out

    def within(
        self, inputs: list[str] | list[list[int]], limit: int, direction: Direction = "left"
    ) -> list[Tokens]:
        """vLLM's ``truncate_prompt_tokens``: each input (text or token ids) cut to ``limit``
        tokens, the model's special tokens counted and kept; ``left`` keeps the last ones.
        Text is tokenised whole and then cut, since the truncating tokenizers are fixed at
        the model's max length."""
        room = limit - len(self._prefix) - len(self._suffix)
        if room < 1:
            raise BadRequest(
                f"truncate_prompt_tokens {limit} leaves no room beside this model's "
                f"{limit - room} special tokens",
                param="truncate_prompt_tokens",
            )
        if inputs and isinstance(inputs[0], str):
            encodings = self._exact.encode_batch(inputs, add_special_tokens=False)
            sequences: list = [e.ids for e in encodings]
        else:
            sequences = list(inputs)
            for seq in sequences:
                self._check_vocabulary(seq, "input")
        out = []
        for seq in sequences:
            kept = seq if len(seq) <= room else seq[-room:] if direction == "left" else seq[:room]
            ids = self._prefix + list(kept) + self._suffix
            full = len(seq) + len(self._prefix) + len(self._suffix)
            out.append(Tokens(ids, [0] * len(ids), full if len(seq) > room else None))
        return out

    # ---- long documents (``ember.processors.chunks``) ------------------------------------
    @property
    def specials(self) -> int:
        """The special tokens the model puts around one text."""
        return len(self._prefix) + len(self._suffix)

    def tokenised(self, texts: list[str]) -> list[Tokenised]:
        """Each text's own tokens whole (no special tokens, no truncation), with their
        character offsets and words: what chunks are planned on and late chunking reads."""
        encodings = self._exact.encode_batch(texts, add_special_tokens=False)
        return [
            Tokenised(text, enc.ids, enc.offsets, enc.word_ids)
            for text, enc in zip(texts, encodings, strict=True)
        ]

    def wrapped(self, ids: Sequence[int]) -> Tokens:
        """``ids`` with the model's special tokens around them, as one input."""
        full = self._prefix + list(ids) + self._suffix
        return Tokens(full, [0] * len(full))

    def _check_vocabulary(self, ids: Sequence[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            hint = FOREIGN_IDS_HINT if param == "input" else ""
            raise BadRequest(
                f"token id {bad[0]} is outside this model's vocabulary "
                f"(0..{self.vocab_size - 1}){hint}",
                param=param,
            )

    def collate(self, tokens: Sequence[Tokens]) -> TokenBatch:
        return collate(tokens, self.pad_id)

    def filler(self, length: int) -> Tokens:
        """A text of ``length`` ordinary tokens, for warm-up batches."""
        length = min(length, self.max_length)
        return Tokens([self.pad_id + 1] * length, [0] * length)

    def prompt_length(self, prompt: str) -> int:
        """The positions a prompt takes at the start of a text, as sentence-transformers
        counts them for ``include_prompt: false``: the prompt tokenised alone, leading
        special tokens in, a trailing special token (``[SEP]``) out."""
        tok = self._truncating["right"]
        ids = tok.encode(prompt).ids
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        return len(ids) - (1 if ids and ids[-1] in special else 0)

    def count(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._exact.encode_batch(texts)]

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """Token ids back to text (TEI's /decode), one string per id sequence."""
        for seq in ids:
            self._check_vocabulary(seq, "ids")
        return self._exact.decode_batch(ids, skip_special_tokens=skip_special_tokens)

    def tokenize_detail(self, text: str, *, add_special_tokens: bool = True) -> list[dict]:
        """TEI's /tokenize shape: id, text, special, start, stop per token."""
        enc = self._truncating["right"].encode(
            text, add_special_tokens=add_special_tokens and self.special_tokens
        )
        return [
            {
                "id": tid,
                "text": tok,
                "special": bool(special),
                "start": None if special else start,
                "stop": None if special else stop,
            }
            for tid, tok, special, (start, stop) in zip(
                enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=False
            )
        ]
