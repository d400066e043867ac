"""ColBERT's text processor: queries and documents are encoded differently (PyLate).

From a PyLate checkpoint's ``config_sentence_transformers.json``:
- the text is stripped and tokenised to ``length - 1`` tokens (``query_length`` or
  ``document_length``), then the ``[Q] ``/``[D] `` marker's id goes in after ``[CLS]``;
- a query is expanded to ``query_length`` with ``[MASK]`` tokens, masked from attention
  unless ``attend_to_expansion_tokens``; all of its positions are returned;
- a document returns its positions whose ids are not in the punctuation skiplist (the
  skiplisted tokens still take part in the forward pass).
Everything else (batching, ids to arrays) is the plain text processor's.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence

from tokenizers import Tokenizer

from ember.batch import TokenBatch, Tokens
from ember.errors import ConfigError
from ember.families.colbert import query_expansion
from ember.models.spec import ResolvedModel
from ember.processors.text import (
    Direction,
    TextTokenizer,
    collate,
    declared_token_ids,
    load_tokenizer,
)


class ColbertTokenizer:
    encodes_queries = True
    side_prompts = False

    def __init__(self, model: ResolvedModel, max_length: int | None = None) -> None:
        assert model.root is not None
        path = model.root / "config_sentence_transformers.json"
        cfg = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        limit = min(model.max_length, max_length or model.max_length)
        self.query_length = min(int(cfg.get("query_length") or 32), limit)
        self.document_length = min(int(cfg.get("document_length") or 180), limit)
        self.expand, self.attend_expansion = query_expansion(model)
        self.max_length = max(self.query_length, self.document_length)
        # Expansion tokens masked from attention but still returned need a backend that
        # computes masked positions (ember.backends.base.Backend.masked_positions).
        self.masks_positions = self.expand and not self.attend_expansion
        tok = load_tokenizer(model.path)
        self._query_prefix = self._token_id(tok, cfg.get("query_prefix", "[Q] "))
        self._document_prefix = self._token_id(tok, cfg.get("document_prefix", "[D] "))
        self._mask_id = self._expansion_id(tok, model)
        words = cfg.get("skiplist_words", list(string.punctuation))
        unk = declared_token_ids(tok, model.path, ("unk_token",)).get("unk_token")
        self._skip = self._skiplist_ids(tok, words, unk)
        room = 1 if self._query_prefix is not None else 0
        self._query = TextTokenizer(model, self.query_length - room)
        room = 1 if self._document_prefix is not None else 0
        self._document = TextTokenizer(model, self.document_length - room)
        self.pad_id = self._document.pad_id

    @staticmethod
    def _token_id(tok: Tokenizer, token: str | None) -> int | None:
        if not token:
            return None
        found = tok.token_to_id(token)
        if found is None:
            found = tok.token_to_id(token.strip())
        if found is None:
            raise ConfigError(f"the ColBERT marker {token!r} is not a token of the tokenizer")
        return int(found)

    @staticmethod
    def _skiplist_ids(tok: Tokenizer, words: list[str], unk: int | None) -> frozenset[int]:
        """PyLate's convert_tokens_to_ids: a word that is no single token maps to the
        tokenizer's unknown token."""
        ids = (tok.token_to_id(w) for w in words)
        return frozenset(i if i is not None else unk for i in ids) - {None}

    @staticmethod
    def _expansion_id(tok: Tokenizer, model: ResolvedModel) -> int:
        """PyLate pads query expansion with the tokenizer's [MASK] (else </s>, else pad)."""
        keys = ("mask_token", "eos_token", "pad_token")
        found = declared_token_ids(tok, model.path, keys)
        for key in keys:
            if key in found:
                return found[key]
        raise ConfigError(f"{model.path}: no [MASK], </s> or pad token for query expansion")

    def _finish(self, tokens: Tokens, query: bool) -> Tokens:
        """Expansion (queries), the marker after [CLS], and the positions kept."""
        ids, mask = list(tokens.ids), [1] * len(tokens.ids)
        prefix = self._query_prefix if query else self._document_prefix
        if query and self.expand:
            room = self.query_length - (1 if prefix is not None else 0)
            ids += [self._mask_id] * (room - len(ids))
            mask += [0] * (room - len(mask))
        if prefix is not None:
            ids, mask = ids[:1] + [prefix] + ids[1:], mask[:1] + [1] + mask[1:]
        if query and self.attend_expansion:
            mask = [1] * len(mask)
        keep = None
        if not query:
            kept = tuple(i for i, t in enumerate(ids) if t not in self._skip)
            keep = kept if len(kept) < len(ids) else None
        return Tokens(
            ids,
            [0] * len(ids),
            tokens.truncated_from,
            attention=None if all(mask) else mask,
            keep=keep,
        )

    def encode(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        direction: Direction = "right",
        query: bool | None = False,
    ) -> list[Tokens]:
        base = self._query if query else self._document
        encoded = base.encode([t.strip() for t in texts], truncate=truncate, direction=direction)
        return [self._finish(t, query) for t in encoded]

    def encode_pairs(self, pairs: list[tuple[str, str]], *, truncate: bool = True) -> list[Tokens]:
        return self._document.encode_pairs(pairs, truncate=truncate)

    def from_ids(
        self, sequences: list[list[int]], *, truncate: bool = True, query: bool | None = False
    ) -> list[Tokens]:
        base = self._query if query else self._document
        return [self._finish(t, query) for t in base.from_ids(sequences, truncate=truncate)]

    def collate(self, tokens: Sequence[Tokens]) -> TokenBatch:
        return collate(tokens, self.pad_id)

    def filler(self, length: int) -> Tokens:
        return self._document.filler(min(length, self.document_length))

    def tokenize_detail(self, text: str, *, add_special_tokens: bool = True) -> list[dict]:
        return self._document.tokenize_detail(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool = True) -> list[str]:
        return self._document.decode(ids, skip_special_tokens=skip_special_tokens)
