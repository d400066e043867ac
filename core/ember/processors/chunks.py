"""Where a long input's chunks lie: token spans cut between words (or sentences), with
their exact character offsets, and the windows late chunking reads a document in.

A chunk never starts inside a word (a word's tokens are the ones with one ``word_id``), so
the chunk's text, cut from the input by its offsets and tokenised alone, gives the tokens
it covered in the whole input: embedding a chunk equals embedding its text. Only a word
longer than a chunk is cut inside. A chunk's characters run from its first token's start to
the next chunk's first token (trailing whitespace left out), so characters no token covers
(combining marks a normaliser strips, control characters) stay with the chunk before them.
A word longer than a chunk is cut where a token starts a new character; only where a
byte-level BPE split every character within reach across two tokens do two chunks share
the one character the cut lies in.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ember.chunking import LATE_WINDOW_OVERLAP, Boundary, Span

# Where a sentence ends: terminal punctuation (closing quotes and brackets kept with it)
# before whitespace or the end, CJK full stops anywhere, and line breaks.
SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|[。！？]+[」』”’）]*|\n")


@dataclass(frozen=True, slots=True)
class Tokenised:
    """An input's own tokens (no special tokens): their ids, character offsets and words."""

    text: str
    ids: Sequence[int]
    offsets: Sequence[tuple[int, int]]
    word_ids: Sequence[int | None]

    def __len__(self) -> int:
        return len(self.offsets)


def _starts(doc: Tokenised) -> list[int]:
    """Token positions a chunk may start at: each word's first token."""
    words = doc.word_ids
    return [i for i in range(len(doc)) if i == 0 or words[i] is None or words[i] != words[i - 1]]


def _sentence_starts(doc: Tokenised, starts: list[int]) -> list[int]:
    """Of ``starts``, those that begin a sentence (a sentence end lies before them, after
    the token before)."""
    ends = [m.end() for m in SENTENCE_END.finditer(doc.text)]
    out = []
    for i in starts:
        if i == 0:
            out.append(0)
            continue
        after, before = doc.offsets[i - 1][1], doc.offsets[i][0]
        k = bisect.bisect_left(ends, after)
        if k < len(ends) and ends[k] <= before:
            out.append(i)
    return out


def _last_at_most(positions: list[int], low: int, high: int) -> int | None:
    """The largest of sorted ``positions`` in ``(low, high]``."""
    k = bisect.bisect_right(positions, high)
    return positions[k - 1] if k and positions[k - 1] > low else None


def _first_at_least(positions: list[int], low: int, floor: int) -> int | None:
    """The smallest of sorted ``positions`` at least ``low`` and above ``floor``."""
    k = bisect.bisect_left(positions, max(low, floor + 1))
    return positions[k] if k < len(positions) else None


def _character_cut(doc: Tokenised, begin: int, end: int) -> int:
    """Where to cut a word longer than a chunk: the last token up to ``end`` that starts a
    new character (a byte-level BPE splits a character's bytes across tokens, which both
    map to the whole character); ``end`` when none does."""
    for p in range(end, begin, -1):
        if doc.offsets[p][0] >= doc.offsets[p - 1][1]:
            return p
    return end


def token_spans(
    doc: Tokenised, size: int, overlap: int = 0, boundary: Boundary = "token"
) -> list[tuple[int, int]]:
    """Chunks of at most ``size`` tokens covering every token, each starting where a word
    (``sentence``: a sentence, when one starts within reach) starts; each after the first
    repeats about ``overlap`` tokens of the one before, from a word's start."""
    n = len(doc)
    if n == 0:
        return [(0, 0)]
    starts = _starts(doc)
    sentences = _sentence_starts(doc, starts) if boundary == "sentence" else []
    spans: list[tuple[int, int]] = []
    begin = 0
    while True:
        if begin + size >= n:
            spans.append((begin, n))
            return spans
        end = (
            _last_at_most(sentences, begin, begin + size)
            or _last_at_most(starts, begin, begin + size)
            or _character_cut(doc, begin, begin + size)  # a word longer than a chunk
        )
        if spans and end <= spans[-1][1]:  # the overlap left no room to go on: none
            begin = spans[-1][1]
            continue
        spans.append((begin, end))
        begin = end
        if overlap:
            back = end - overlap
            sentence = _first_at_least(sentences, back, spans[-1][0]) if sentences else None
            word = _first_at_least(starts, back, spans[-1][0])
            begin = next((s for s in (sentence, word) if s is not None and s < end), end)


def char_span(doc: Tokenised, start: int, end: int) -> tuple[int, int]:
    """The characters tokens ``[start, end)`` take: from the first's start to where the next
    token starts (the text's end after the last), trailing whitespace left out."""
    text = doc.text
    if start >= end:  # no tokens (an empty or all-whitespace input): the whole input
        return 0, len(text)
    first = doc.offsets[start][0]
    stop = doc.offsets[end][0] if end < len(doc) else len(text)
    last = max(doc.offsets[end - 1][1], first)
    while stop > last and text[stop - 1].isspace():
        stop -= 1
    return first, max(stop, last)


def plan(doc: Tokenised, size: int, overlap: int = 0, boundary: Boundary = "token") -> list[Span]:
    """``doc``'s chunks with their token and character offsets."""
    return [Span(a, b, *char_span(doc, a, b)) for a, b in token_spans(doc, size, overlap, boundary)]


def given_spans(texts: Sequence[str], separator: str = " ") -> tuple[str, list[tuple[int, int]]]:
    """Jina's late chunking: the strings of a request are one document's chunks, joined by
    ``separator``; each string's characters in the joined document."""
    spans, at = [], 0
    for text in texts:
        spans.append((at, at + len(text)))
        at += len(text) + len(separator)
    return separator.join(texts), spans


def spans_of_chars(doc: Tokenised, chars: Sequence[tuple[int, int]]) -> list[Span]:
    """For character ranges of ``doc``, the tokens each covers: those starting inside it."""
    starts = [a for a, _ in doc.offsets]
    out = []
    for a, b in chars:
        first, last = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)
        out.append(Span(first, last, a, b))
    return out


@dataclass(frozen=True, slots=True)
class Window:
    """One forward of late chunking: tokens ``[start, end)`` of the document, and the ones
    ``[own_start, own_end)`` whose vectors it gives (those most central in it)."""

    start: int
    end: int
    own_start: int
    own_end: int


def windows(n: int, width: int) -> list[Window]:
    """Windows of ``width`` tokens over ``n`` tokens, overlapping by a quarter of a window
    (``LATE_WINDOW_OVERLAP``), the last ending at ``n``; each token belongs to the window
    whose centre is nearest it (the earlier on a tie)."""
    if n <= width:
        return [Window(0, n, 0, n)]
    stride = max(1, width - int(width * LATE_WINDOW_OVERLAP))
    bounds = list(range(0, n - width, stride)) + [n - width]
    cuts = [0]
    for left, right in zip(bounds, bounds[1:], strict=False):
        # the first token nearer the right window's centre (t + 0.5 > (l + r + width) / 2;
        # a tie stays with the left window)
        cuts.append((left + right + width + 1) // 2)
    cuts.append(n)
    return [Window(a, a + width, cuts[i], cuts[i + 1]) for i, a in enumerate(bounds)]
