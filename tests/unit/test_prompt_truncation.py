"""vLLM's ``truncate_prompt_tokens`` in the text processor (``TextTokenizer.within``) and
what a left cut leaves of a prompt the model pools without (``_skip_prompt``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.batch import Tokens
from ember.engine.text_inputs import _skip_prompt
from ember.errors import BadRequest
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from ember.processors.text import TextTokenizer

TEXTS = ["a short one", "the quick brown fox jumps over the lazy dog " * 3]


@pytest.fixture(scope="module")
def tokenizer(minilm_path: Path) -> TextTokenizer:
    return TextTokenizer(resolve_model(ModelSpec(model_id=str(minilm_path))))


def test_within_the_max_is_the_usual_encoding(tokenizer: TextTokenizer) -> None:
    plain = tokenizer.encode(TEXTS)
    assert [t.ids for t in tokenizer.within(TEXTS, tokenizer.max_length)] == [t.ids for t in plain]


def test_left_keeps_the_last_tokens_and_the_special_ones(tokenizer: TextTokenizer) -> None:
    full = tokenizer.encode(TEXTS[1:])[0].ids  # [CLS] ... [SEP]
    left, right = (tokenizer.within(TEXTS[1:], 7, d)[0] for d in ("left", "right"))
    assert left.ids == full[:1] + full[-6:]  # [CLS] + the last 5 tokens + [SEP]
    assert right.ids == full[:6] + full[-1:]
    assert left.truncated_from == right.truncated_from == len(full)
    ids = tokenizer.within([full[1:-1]], 7)[0]  # token-id input: cut the same way
    assert ids.ids == left.ids and ids.truncated_from == len(full)
    assert tokenizer.within(TEXTS[:1], 7)[0].truncated_from is None  # short: whole


def test_no_room_beside_the_special_tokens_is_refused(tokenizer: TextTokenizer) -> None:
    with pytest.raises(BadRequest, match="no room beside this model's 2 special tokens"):
        tokenizer.within(TEXTS, 2)
    with pytest.raises(BadRequest, match="outside this model's vocabulary"):
        tokenizer.within([[10**6]], 8)


class _Lead:
    leading_specials = 1  # [CLS]


def test_a_left_cut_takes_the_prompt_first() -> None:
    """skip 5: [CLS] and a 4-token prompt. Cutting 2 tokens from the left leaves 2 prompt
    tokens to skip; cutting the whole prompt (or more) leaves [CLS] alone to skip."""
    cut = [Tokens([0] * 10, [0] * 10, truncated_from=n) for n in (None, 12, 14, 20)]
    left = _skip_prompt(lambda: cut, 5, _Lead(), "left")
    assert [t.pool_from for t in left] == [5, 3, 1, 1]
    right = _skip_prompt(lambda: cut, 5, _Lead(), "right")  # the prompt is kept
    assert [t.pool_from for t in right] == [5, 5, 5, 5]
