"""A long text is cut before tokenising and the tokens kept never change (SPEC-NOTES): the
cut's encodings equal the whole text's truncated encodings, on texts made to defeat a
bound by characters alone (runs of whitespace, marks a normaliser strips, control
characters), both truncation sides; and the count comes from the truncated encoding."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer

from ember.errors import BadRequest
from ember.processors.cut import TextCut, encoded_length
from ember.processors.text import TextTokenizer

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def tokenizers(minilm_path: Path) -> tuple[TextTokenizer, Tokenizer]:
    model = SimpleNamespace(path=minilm_path, max_length=MAX_LENGTH, config={})
    whole = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    whole.no_padding()
    return TextTokenizer(model), whole  # type: ignore[arg-type]


def _texts() -> list[str]:
    rng = random.Random(0)
    words = ["alpha", "telecommunications", "x", "中文字", "naïve", "!!", "e\u0301"]
    fillers = [" " * 400, "\u0301" * 60, "\x00" * 50, "\n\t" * 90]
    texts = []
    for n in (40, 400, 3000):
        parts = [rng.choice(words + fillers if n < 3000 else words) for _ in range(n)]
        texts.append(" ".join(parts))
    texts.append(" " * 50_000 + "word " * 200)  # nothing but whitespace where a bound cuts
    texts.append("supercalifragilistic" * 3000)  # one long word, no whitespace at all
    return texts


@pytest.mark.parametrize("side", ["right", "left"])
def test_cut_keeps_the_tokens_a_truncating_tokenizer_keeps(
    tokenizers: tuple[TextTokenizer, Tokenizer], side: str
) -> None:
    ours, whole = tokenizers
    whole.enable_truncation(MAX_LENGTH, direction=side)
    texts = _texts()
    got = ours.encode(texts, direction=side)  # type: ignore[arg-type]
    for text, tokens in zip(texts, got, strict=True):
        assert tokens.ids == whole.encode(text).ids, (side, len(text))
    assert len(texts[2]) > ours._cut.chars  # the case the cut is for was exercised


def test_count_comes_from_the_truncated_encoding(
    tokenizers: tuple[TextTokenizer, Tokenizer],
) -> None:
    _, whole = tokenizers
    whole.enable_truncation(MAX_LENGTH)
    text = "the cat sat on the mat " * 100
    exact = Tokenizer.from_str(whole.to_str())
    exact.no_truncation()
    assert encoded_length(whole.encode(text)) == len(exact.encode(text).ids)


def test_a_cut_text_that_may_not_be_truncated_is_refused_without_a_whole_count(
    tokenizers: tuple[TextTokenizer, Tokenizer],
) -> None:
    ours, _ = tokenizers
    with pytest.raises(BadRequest) as err:
        ours.encode(["word " * 400_000], truncate=False)  # 2 MB
    assert "more than" in err.value.message and f"maximum of {MAX_LENGTH}" in err.value.message


def test_the_bound_follows_the_vocabulary() -> None:
    cut = TextCut(max_length=10, token_chars=4)
    assert cut.chars == 10 * 4 + cut.margin
    assert cut.piece("abcdef", "right", 3) == "abc" and cut.piece("abcdef", "left", 3) == "def"
