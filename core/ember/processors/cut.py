"""Text longer than a model can use, cut before it is tokenised, without changing the
tokens a truncating tokenizer keeps.

One 1.95 MB text cost ~9 s and +1.2 GB when it was tokenised whole (and then again, to
count it), though a 256-token model keeps the first 256 tokens. SPEC-NOTES bounds the cut
by the model: no token covers more characters than the vocabulary's longest token, so
``max_length`` tokens come from at most ``max_length x longest`` characters, plus a margin.
That holds for the characters a tokenizer sees after normalising; a text can still spend
characters on no token (runs of whitespace, control characters, combining marks a
normaliser strips). So the cut is also checked: it is kept only when the kept tokens
overflow it and end ``margin`` characters before it (the word the cut splits is never
among them); else the cut grows fourfold, up to the whole text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from tokenizers import Encoding, Tokenizer

# Tokens' worth of characters between the last kept token and the cut: the word the cut
# splits, and the few words a segmentation (Unigram, BPE) looks across, lie there.
MARGIN_TOKENS = 8
GROWTH = 4

Side = Literal["right", "left"]
T = TypeVar("T")


def longest_token_chars(tokenizer: Tokenizer) -> int:
    """Characters of the vocabulary's longest token (markers like ``##`` included: an
    over-estimate is safe)."""
    return max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1)


@dataclass(frozen=True)
class TextCut:
    """How much of a text a model of ``max_length`` tokens can use, and the check that a
    cut changed nothing."""

    max_length: int
    token_chars: int

    @property
    def margin(self) -> int:
        return MARGIN_TOKENS * self.token_chars

    @property
    def chars(self) -> int:
        return self.max_length * self.token_chars + self.margin

    def piece(self, text: str, side: Side, chars: int | None = None) -> str:
        """The part of ``text`` truncation on ``side`` keeps from (``text`` itself when short):
        the first (right) or last (left) ``chars`` characters."""
        chars = self.chars if chars is None else chars
        if len(text) <= chars:
            return text
        return text[:chars] if side == "right" else text[len(text) - chars :]

    def safe(self, encoding: Encoding, piece_chars: int, side: Side) -> bool:
        """Whether the tokens ``encoding`` (of a cut piece) kept are those of the whole text:
        truncation cut inside the piece, ``margin`` characters clear of its cut end."""
        if not encoding.overflowing:
            return False
        spans = [
            o
            for o, special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True)
            if not special
        ]
        if not spans:
            return False
        if side == "right":
            return max(end for _, end in spans) + self.margin <= piece_chars
        return min(start for start, _ in spans) >= self.margin

    def grown(
        self, text: str, side: Side, encode: Callable[[str], T], safe: Callable[[T, str], bool]
    ) -> tuple[T, str]:
        """``encode`` of a cut piece of ``text`` that ``safe`` accepts (of the piece that
        grew ``GROWTH``-fold until it did, or of the whole text), and that piece: the same
        cut for a tokenizer that wraps the text (a processor's prompt) and so cannot
        truncate it alone."""
        chars = self.chars
        piece = self.piece(text, side, chars)
        result = encode(piece)
        while len(piece) < len(text) and not safe(result, piece):
            chars *= GROWTH
            piece = self.piece(text, side, chars)
            result = encode(piece)
        return result, piece

    def encode(
        self, tokenizer: Tokenizer, texts: Sequence[str], side: Side, special_tokens: bool
    ) -> tuple[list[Encoding], list[str]]:
        """``tokenizer``'s (truncating) encodings of ``texts``, long ones from a cut piece,
        and the pieces (a text itself where not cut). A text whose cut fails ``safe`` is
        encoded again from a piece ``GROWTH`` times larger, until it is whole."""
        pieces = [self.piece(t, side) for t in texts]
        encodings = tokenizer.encode_batch(pieces, add_special_tokens=special_tokens)
        cut = [len(p) < len(t) for p, t in zip(pieces, texts, strict=True)]
        for i, text in enumerate(texts):
            chars = self.chars
            while cut[i] and not self.safe(encodings[i], len(pieces[i]), side):
                chars *= GROWTH
                pieces[i] = self.piece(text, side, chars)
                cut[i] = len(pieces[i]) < len(text)
                encodings[i] = tokenizer.encode(pieces[i], add_special_tokens=special_tokens)
        return encodings, pieces


def encoded_length(encoding: Encoding) -> int:
    """The tokens of the text before truncation, from the truncated encoding alone (its
    overflowing pieces carry the rest, each wrapped in its own special tokens): counting
    without tokenising the text a second time."""
    special = sum(encoding.special_tokens_mask)
    content = len(encoding.ids) - special
    for piece in encoding.overflowing:
        content += len(piece.ids) - sum(piece.special_tokens_mask)
    return content + special
