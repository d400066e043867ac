"""Chunk planning (``ember.processors.chunks``): chunks cover every token, start where words
(or sentences) start, hold their size and overlap, and their character offsets are code
points of the input — on WordPiece (MiniLM's) and on a byte-level BPE, where a byte offset
would land inside a character; late chunking's windows give every token to the window it
is most central in."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ember.chunking import Chunking, chunking_of
from ember.errors import BadRequest
from ember.processors.chunks import Tokenised, plan, token_spans, windows

CORPUS = (
    "Café crème, naïve résumé — e\u0301 a\u0308 n\u0303. 東京は日本の首都です。人口は多い！ "
    "שלום עולם. مرحبا بالعالم؟ Emoji 👩\u200d👩\u200d👧 👍🏽 🇫🇷 🙂🚀. Zero\u200bwidth and "
    "non\u00a0breaking; tabs\tand\nnewlines. The end."
)


def _tokenised(tokenizer: Tokenizer, text: str) -> Tokenised:
    enc = tokenizer.encode(text, add_special_tokens=False)
    return Tokenised(text, enc.ids, enc.offsets, enc.word_ids)


@pytest.fixture(scope="module")
def wordpiece(minilm_path: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    """A byte-level BPE (GPT-2's, Qwen's kind) trained on the corpus: its offsets map bytes
    back to characters, which a multi-byte character tests."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([CORPUS] * 4, trainer)
    return tok


@pytest.mark.parametrize("kind", ["wordpiece", "byte_bpe"])
@pytest.mark.parametrize(("size", "overlap"), [(4, 0), (7, 2), (16, 5), (1000, 0)])
@pytest.mark.parametrize("boundary", ["token", "sentence"])
def test_offsets_are_code_points_and_chunks_tile_the_text(
    request: pytest.FixtureRequest, kind: str, size: int, overlap: int, boundary: str
) -> None:
    doc = _tokenised(request.getfixturevalue(kind), CORPUS)
    spans = plan(doc, size, overlap, boundary)  # type: ignore[arg-type]
    assert spans[0].token_start == 0 and spans[-1].token_end == len(doc)
    for span in spans:
        assert CORPUS[span.char_start : span.char_end]
        # past its last token, a chunk keeps what no token covers, not trailing whitespace
        tail = CORPUS[doc.offsets[span.token_end - 1][1] : span.char_end]
        assert tail == tail.rstrip()
        assert 0 < span.tokens <= size
        # each of the chunk's tokens lies inside the chunk's characters
        for a, b in doc.offsets[span.token_start : span.token_end]:
            assert span.char_start <= a and b <= span.char_end
    if overlap == 0:  # consecutive chunks: only whitespace between them, nothing lost
        shared = 0
        for left, right in zip(spans, spans[1:], strict=False):
            assert left.token_end == right.token_start
            if left.char_end > right.char_start:
                # a byte-level BPE split one character's bytes across the two tokens at the
                # cut (no cut between whole characters within reach): both hold it
                cut = right.token_start
                assert doc.offsets[cut][0] < doc.offsets[cut - 1][1]
                assert left.char_end - right.char_start == 1
                shared += 1
            else:
                assert CORPUS[left.char_end : right.char_start].strip() == ""
        if kind == "wordpiece":
            assert shared == 0
        if shared == 0:
            joined = "".join(CORPUS[s.char_start : s.char_end] for s in spans)
            assert "".join(joined.split()) == "".join(CORPUS.split())


def test_combining_marks_stay_with_their_letter(wordpiece: Tokenizer) -> None:
    text = "e\u0301 a\u0308"
    doc = _tokenised(wordpiece, text)
    first = plan(doc, 1)[0]
    assert text[first.char_start : first.char_end] == "e\u0301"  # the normaliser drops it


def test_sentence_boundaries_win_within_reach(wordpiece: Tokenizer) -> None:
    text = "One two three. Four five six seven. Eight nine."
    doc = _tokenised(wordpiece, text)
    chunks = [text[s.char_start : s.char_end] for s in plan(doc, 6, 0, "sentence")]
    assert chunks == ["One two three.", "Four five six seven.", "Eight nine."]


# ---- properties of the token cuts, on made-up words --------------------------------------


@st.composite
def documents(draw: st.DrawFn) -> Tokenised:
    """Words of 1-5 tokens, one character each, separated by spaces."""
    lengths = draw(st.lists(st.integers(1, 5), min_size=0, max_size=60))
    offsets, words, at = [], [], 0
    for w, n in enumerate(lengths):
        for _ in range(n):
            offsets.append((at, at + 1))
            words.append(w)
            at += 1
        at += 1  # the space
    return Tokenised("x" * at, list(range(len(offsets))), offsets, words)


@settings(max_examples=200, deadline=None)
@given(doc=documents(), size=st.integers(1, 12), overlap=st.integers(0, 11))
def test_token_cuts(doc: Tokenised, size: int, overlap: int) -> None:
    overlap = min(overlap, size - 1)
    spans = token_spans(doc, size, overlap)
    n = len(doc)
    if n == 0:
        assert spans == [(0, 0)]
        return
    assert spans[0][0] == 0 and spans[-1][1] == n
    starts = {i for i in range(n) if i == 0 or doc.word_ids[i] != doc.word_ids[i - 1]}
    for k, (a, b) in enumerate(spans):
        assert 0 < b - a <= size
        if k:
            prev_a, prev_b = spans[k - 1]
            assert prev_a < a <= prev_b < b  # progress; never a gap
            assert prev_b - a <= overlap
        # a chunk starts at a word's start unless the word before ran past a chunk
        assert a in starts or (k and spans[k - 1][1] - spans[k - 1][0] == size)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), width=st.integers(4, 512))
def test_windows_give_each_token_to_its_most_central_window(n: int, width: int) -> None:
    found = windows(n, width)
    assert found[0].start == 0 and found[-1].end == n
    assert found[0].own_start == 0 and found[-1].own_end == n
    for left, right in zip(found, found[1:], strict=False):
        assert left.own_end == right.own_start  # each token owned once
        assert right.start < left.end  # windows overlap
    for w in found:
        assert w.end - w.start == min(width, n)
        assert w.start <= w.own_start < w.own_end <= w.end
    centres = [(w.start + w.end) / 2 for w in found]
    for t in {0, n - 1, n // 2, *(w.own_start for w in found)}:
        owner = next(i for i, w in enumerate(found) if w.own_start <= t < w.own_end)
        best = min(range(len(found)), key=lambda i: (abs(t + 0.5 - centres[i]), i))
        assert owner == best


def test_the_fields_decode_and_refuse_in_words() -> None:
    assert chunking_of(overflow=None) is None
    assert chunking_of(overflow="truncate") is None
    assert chunking_of(overflow="chunk") == Chunking()
    assert chunking_of(overflow=None, late=True) == Chunking(late=True, given=True)
    assert chunking_of(overflow=None, chunked=True, size=8, late=True).given is False
    for kwargs, words in [
        ({"overflow": "error", "chunked": True}, "overflow"),
        ({"overflow": None, "aggregate": "max"}, "aggregate"),
        ({"overflow": "chunk", "size": 4, "overlap": 4}, "overlap"),
        ({"overflow": "sideways"}, "overflow"),
    ]:
        with pytest.raises(BadRequest, match=words):
            chunking_of(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="late_chunking"):
        Chunking(size=600).within(254)
    assert Chunking(size=600, late=True).within(254) == 600
