"""A retrieval VLM's text query (ColPali, ColQwen2) through its processor's prompt, cut
before it is tokenised and held to the model's max length.

``process_queries`` wraps a query in the model's prompt (ColPali: ``<bos>Question: {q}``,
ten ``<pad>`` augmentation tokens and ``\\n``; ColQwen2: ``Query: {q}``, ten
``<|endoftext|>`` and ``\\n``) and tokenises it whole without truncating, as
colpali-engine's processors do (``padding="longest"``, no ``truncation``): a 2 MB query was
tokenised whole and its ~600k tokens sent to the forward, past the positions the language
model has. Here a query longer than the model can use is cut as ``ember.processors.cut``
cuts text (the processor tokenises the cut piece, offsets checked against the piece's
end), and one longer than ``max_length`` tokens keeps its first tokens and the prompt's
augmentation suffix (the buffers the model reads the query through), as a truncating
tokenizer keeps its closing special tokens; ``truncate: false`` refuses it instead. A query
that fits is tokenised exactly as before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ember.errors import ConfigError
from ember.processors.cut import TextCut

Arrays = dict[str, np.ndarray]


class QueryPrompt:
    """The query path of one ColPali/ColQwen2 processor at ``max_length`` tokens.
    ``cut`` None (a slow tokenizer, no offsets): queries are tokenised whole."""

    def __init__(self, processor: Any, max_length: int, cut: TextCut | None) -> None:
        self.processor = processor
        self.max_length = max_length
        self.cut = cut
        empty = self._prompt("")["input_ids"][0]
        token = getattr(processor, "query_augmentation_token", None)
        token_id = processor.tokenizer.convert_tokens_to_ids(token) if token else None
        first = np.flatnonzero(empty == token_id) if token_id is not None else np.array([])
        # The prompt's tokens after the query: the augmentation tokens and what follows.
        self.suffix = len(empty) - int(first[0]) if first.size else 0
        if max_length <= len(empty):
            raise ConfigError(
                f"a max length of {max_length} tokens leaves no room for a query beside the "
                f"model's {len(empty)}-token query prompt"
            )

    def encode(self, text: str) -> tuple[Arrays, str]:
        """The processor's arrays for ``text`` (``offset_mapping`` among them where the
        tokenizer is fast), from a cut piece when that changes none of the tokens kept, and
        the piece (``text`` itself when not cut)."""
        if self.cut is None:
            return self._prompt(text), text
        return self.cut.grown(text, "right", self._prompt, self._safe)

    def truncated(self, arrays: Arrays) -> Arrays:
        """``arrays`` of a query over ``max_length`` tokens: its first tokens, then the
        prompt's suffix, ``max_length`` in all."""
        length = arrays["input_ids"].shape[-1]
        keep = self.max_length - self.suffix
        return {
            name: np.concatenate([a[..., :keep], a[..., length - self.suffix :]], axis=-1)
            if a.ndim == 2 and a.shape[-1] == length
            else a
            for name, a in arrays.items()
            if name != "offset_mapping"
        }

    def _prompt(self, text: str) -> Arrays:
        # ColPali's processor builds its outputs with torch ops: ask for tensors.
        raw = self.processor.process_queries(
            [text], return_tensors="pt", return_offsets_mapping=self.cut is not None
        )
        return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in raw.items()}

    def _safe(self, arrays: Arrays, piece: str) -> bool:
        """Whether the tokens a truncated prompt of ``piece`` keeps are those of the whole
        query's: it overflows ``max_length``, and its last kept query token ends ``margin``
        characters before the piece does (where the suffix's first token starts)."""
        assert self.cut is not None
        length = arrays["input_ids"].shape[-1]
        if length <= self.max_length:
            return False
        offsets = arrays["offset_mapping"][0]
        kept_end = int(offsets[self.max_length - self.suffix - 1][1])
        query_end = int(offsets[length - self.suffix][0] if self.suffix else offsets[-1][1])
        return kept_end + self.cut.margin <= query_end
