"""Long-document reranking's pure parts (``ember.engine.long_rerank``): the (query, chunk)
pairs a request's documents become, the best chunk per document, and what refuses the
option. The scores against the reference: tests/integration/test_long_rerank.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer

from ember.chunking import Span
from ember.engine.long_rerank import best_chunks, chunk_pairs, refusal
from ember.engine.requests import RerankRequest
from ember.errors import BadRequest
from ember.families.registry import by_name
from ember.models.resolve import default_model_path
from ember.processors.chunks import Tokenised

LONG = "One two three four five six seven eight nine ten eleven twelve thirteen."


def tokenised(text: str) -> Tokenised:
    tokenizer = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    enc = tokenizer.encode(text, add_special_tokens=False)
    return Tokenised(text, enc.ids, enc.offsets, enc.word_ids)


def test_chunk_pairs_cut_long_documents_and_keep_short_ones_as_sent() -> None:
    long, short = tokenised(LONG), tokenised("  Short one. ")
    chunked = chunk_pairs("q", [short, long], size=4, limit=None)
    assert chunked.spans[0] == [Span(0, len(short), 0, len(short.text))]
    assert chunked.pairs[0] == ("q", "  Short one. ")  # as sent, whitespace and all
    spans = chunked.spans[1]
    assert len(spans) == -(-len(long) // 4) and all(s.tokens <= 4 for s in spans)
    assert [p for _, p in chunked.pairs[1:]] == [LONG[s.char_start : s.char_end] for s in spans]
    assert chunked.cut == []
    limited = chunk_pairs("q", [short, long, long], size=4, limit=2)
    assert [len(s) for s in limited.spans] == [1, 2, 2] and limited.cut == [1, 2]
    assert limited.spans[1] == spans[:2] and len(limited.pairs) == 5


def test_best_chunks_takes_each_documents_best_the_first_on_a_tie() -> None:
    spans = [[Span(0, 1, 0, 1)], [Span(0, 2, 0, 5), Span(2, 4, 6, 9), Span(4, 5, 10, 12)]]
    out = best_chunks(np.array([0.2, 0.1, 0.7, 0.7]), spans)
    assert out.values.tolist() == [0.2, 0.7] and list(out.best) == [0, 1]
    assert list(out.spans) == [spans[0][0], spans[1][1]]
    assert out.best_first().tolist() == [1, 0]


def model(family: str) -> SimpleNamespace:
    return SimpleNamespace(family=by_name(family), served_name="m")


def test_maxsim_media_and_other_processors_refuse_in_one_line() -> None:
    text = RerankRequest("q", ["d"], max_tokens_per_doc=8)
    maxsim = refusal(model("colbert"), text, "maxsim", object())
    assert isinstance(maxsim, BadRequest) and "MaxSim" in str(maxsim)
    assert maxsim.param == "max_tokens_per_doc"
    pages = RerankRequest("q", ["https://x/p.png"], modality="image", max_chunks_per_doc=2)
    media = refusal(model("colpali"), pages, "maxsim", object())
    assert isinstance(media, BadRequest) and "image documents" in str(media)
    assert media.param == "max_chunks_per_doc"
    other = refusal(model("cross-encoder"), text, "cross-encoder", object())
    assert isinstance(other, BadRequest) and "its own way" in str(other)


@pytest.mark.parametrize("field", ["max_tokens_per_doc", "max_chunks_per_doc"])
def test_the_options_are_at_least_one(field: str) -> None:
    assert RerankRequest("q", ["d"], **{field: 1}).chunked
    assert not RerankRequest("q", ["d"]).chunked
    with pytest.raises(BadRequest) as refused:
        RerankRequest("q", ["d"], **{field: 0})
    assert refused.value.param == field
