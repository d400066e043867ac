"""ColPali and ColQwen2 queries are cut before tokenising (``ember.families.vlm.queries``): the
tokens kept are those of the whole query's prompt (its first tokens, then the prompt's
augmentation suffix, ``max_length`` in all), on texts made to defeat a bound by characters
alone; a query that fits is tokenised exactly as the processor does; the processor never
sees more than the cut of a long query. TEI's /tokenize rows on these models are cut and
truncated the same way."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.errors import BadRequest
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from ember.processors.cut import GROWTH, TextCut
from ember.processors.media import MediaProcessor, build_media_processor
from tests.fixtures.media_models import build_tiny_colpali, build_tiny_colqwen2

MAX_LENGTH = 64
BUILDERS: dict[str, Callable[[], Path]] = {
    "colpali": build_tiny_colpali,
    "colqwen2": build_tiny_colqwen2,
}
LONG = "word " * 380_000  # 1.9 MB: what a 2 MB request body holds


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def processor(request: pytest.FixtureRequest) -> MediaProcessor:
    model = resolve_model(ModelSpec(model_id=str(BUILDERS[request.param]())))
    return build_media_processor(model, MAX_LENGTH)


def _whole(processor: MediaProcessor, text: str) -> np.ndarray:
    """The processor's own ids for ``text``, tokenised whole (as before the cut)."""
    return processor.processor.process_queries([text], return_tensors="pt")["input_ids"][0].numpy()


def _texts() -> list[str]:
    rng = random.Random(1)
    words = ["alpha", "the", "query", "x", "中文字", "naïve", "!!", "e\u0301", "<pad>"]
    fillers = [" " * 400, "\u0301" * 60, "\x00" * 50, "\n\t" * 90]
    texts = [" ".join(rng.choice(words + fillers) for _ in range(n)) for n in (20, 400, 3000)]
    texts.append(" " * 50_000 + "word " * 200)  # nothing but whitespace where a bound cuts
    texts.append("supercalifragilistic" * 3000)  # one long word, no whitespace at all
    return texts


def test_long_queries_keep_the_whole_querys_first_tokens_and_the_suffix(
    processor: MediaProcessor,
) -> None:
    suffix = _whole(processor, "")[-processor._queries.suffix :]  # type: ignore[union-attr]
    assert len(suffix) == 11  # ten augmentation tokens and "\n", both processors
    cut = 0
    for text in _texts():
        whole = _whole(processor, text)
        got = processor.encode([text])[0].arrays["input_ids"][0]
        if len(whole) <= MAX_LENGTH:
            assert np.array_equal(got, whole), len(text)
            continue
        want = np.concatenate([whole[: MAX_LENGTH - len(suffix)], suffix])
        assert np.array_equal(got, want), len(text)
        cut += len(text) > processor._cut.chars  # type: ignore[union-attr]
    assert cut >= 2  # the cases the cut is for were exercised


def test_a_query_that_fits_is_tokenised_as_the_processor_does(
    processor: MediaProcessor,
) -> None:
    for text in ("", "x", "What is the capital of France?", "the " * 10):
        item = processor.encode([text])[0]
        raw = processor.processor.process_queries([text], return_tensors="pt")
        assert set(item.arrays) == set(raw) - {"labels"}
        for name, array in item.arrays.items():
            assert np.array_equal(array, raw[name].numpy()), (text, name)


def _recording(processor: MediaProcessor, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text the processor's query path tokenises from now on."""
    seen: list[int] = []
    original = processor.processor.process_queries

    def process_queries(text: list[str], **kwargs: Any) -> Any:
        seen.extend(len(t) for t in text)
        return original(text, **kwargs)

    monkeypatch.setattr(processor.processor, "process_queries", process_queries)
    return seen


def test_a_2mb_query_is_tokenised_from_its_cut_only(
    processor: MediaProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recording(processor, monkeypatch)
    got = processor.encode([LONG])[0].arrays["input_ids"]
    chars = processor._cut.chars  # type: ignore[union-attr]
    assert seen == [chars] and chars * GROWTH < len(LONG) // 100
    # The same ids as a hand cut at a word boundary, far past the model's max length.
    by_hand = processor.encode([LONG[: 5 * 10 * MAX_LENGTH]])[0].arrays["input_ids"]
    assert got.shape == (1, MAX_LENGTH) and np.array_equal(got, by_hand)


def test_a_long_query_that_may_not_be_truncated_is_refused_from_its_cut(
    processor: MediaProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _recording(processor, monkeypatch)
    with pytest.raises(BadRequest) as err:
        processor.encode([LONG], truncate=False)
    assert "input 0: more than" in err.value.message
    assert f"takes ({MAX_LENGTH})" in err.value.message
    assert max(seen) < len(LONG) // 100
    with pytest.raises(BadRequest) as err:  # short in characters, long in tokens
        processor.encode(["ok", "the " * MAX_LENGTH], truncate=False)
    assert re.match(r"input 1: \d+ tokens, more than", err.value.message)  # counted whole


def test_a_cut_whose_kept_tokens_end_within_the_margin_is_not_safe(
    processor: MediaProcessor,
) -> None:
    queries = processor._queries
    assert queries is not None
    just_over = "the " * MAX_LENGTH  # overflows, but its kept tokens end near its end
    assert not queries._safe(queries._prompt(just_over), just_over)
    far_over = "the " * 10 * MAX_LENGTH
    assert queries._safe(queries._prompt(far_over), far_over)
    fits = "the"
    assert not queries._safe(queries._prompt(fits), fits)


def test_an_unsafe_cut_grows_until_safe_or_whole() -> None:
    cut = TextCut(max_length=10, token_chars=4)
    tried: list[int] = []

    def encode(piece: str) -> int:
        tried.append(len(piece))
        return len(piece)

    text = "x" * 10_000
    assert cut.grown(text, "right", encode, lambda n, _: n >= 1000) == (
        cut.chars * GROWTH**2,
        text[: cut.chars * GROWTH**2],
    )
    assert tried == [cut.chars, cut.chars * GROWTH, cut.chars * GROWTH**2]
    assert cut.grown(text, "left", encode, lambda n, _: False) == (len(text), text)
    assert cut.grown("short", "right", encode, lambda n, _: False) == (5, "short")


class _Recording:
    """The processor's tokenizer, recording the length of each text it is called on."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.seen = tokenizer, []

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.seen.append(len(text))
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_rows_are_cut_and_truncated_at_the_max_length(
    processor: MediaProcessor, monkeypatch: pytest.MonkeyPatch, special: bool
) -> None:
    """TEI's /tokenize on these models: the tokenizer's own tokens, as many as the model
    takes, the same from a cut as from the whole text."""
    tokenizer = processor.tokenizer
    for text in _texts():
        rows = processor.tokenize_detail(text, add_special_tokens=special)
        whole = tokenizer(text, add_special_tokens=special, truncation=True, max_length=MAX_LENGTH)
        assert [r["id"] for r in rows] == whole["input_ids"], len(text)
    recording = _Recording(tokenizer)
    monkeypatch.setattr(processor, "tokenizer", recording)
    rows = processor.tokenize_detail(LONG, add_special_tokens=special)
    assert recording.seen == [processor._cut.chars]  # type: ignore[union-attr]
    assert len(rows) == MAX_LENGTH
    assert rows == processor.tokenize_detail(
        LONG[: 5 * 10 * MAX_LENGTH], add_special_tokens=special
    )
