"""Heads on the shapes backends may return, and routing by what a model can do."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ember.batch import ATTENTION, TOKEN_STATES, Tokens
from ember.heads.sparse import LexicalWeightsHead
from ember.processors.text import collate


def test_lexical_weights_take_a_mask_wider_than_the_batch() -> None:
    """Neuron returns states and mask widened to its bucket; ids cover the batch only."""
    batch = collate([Tokens([0, 7, 9, 7, 2], [0] * 5), Tokens([0, 5, 2], [0] * 3)], pad_id=1)
    rng = np.random.default_rng(0)
    states = rng.normal(size=(2, 5, 4)).astype(np.float32)
    head = LexicalWeightsHead(np.ones((1, 4), np.float32), np.array([5.0]), frozenset({0, 1, 2}))
    want = head.split({TOKEN_STATES: states}, batch, [0, 1])
    wide_states = np.concatenate([states, rng.normal(size=(2, 6, 4)).astype(np.float32)], 1)
    wide_mask = np.concatenate([batch.attention_mask, np.zeros((2, 6), np.int64)], 1)
    got = head.split({TOKEN_STATES: wide_states, ATTENTION: wide_mask}, batch, [0, 1])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.indices, w.indices)
        np.testing.assert_allclose(g.values, w.values)
    assert got[0].indices.tolist() == [7, 9]  # special ids dropped, one weight per id


@pytest.mark.parametrize(
    ("caps", "body", "route"),
    [
        ({"embed_sparse"}, {"inputs": "hi"}, "/embed_sparse"),
        ({"embed_multi", "rerank"}, {"inputs": "hi"}, "/embed_all"),
        ({"embed", "embed_sparse", "embed_multi", "rerank"}, {"inputs": "hi"}, "/embed"),
        ({"embed_sparse"}, {"input": "hi"}, "/v1/embeddings"),
        ({"classify"}, {"inputs": "hi"}, "/predict"),
        ({"embed"}, {"texts": ["hi"]}, "/v2/embed"),
    ],
)
def test_invocations_route_by_what_the_model_serves(caps: set, body: dict, route: str) -> None:
    from ember.platform import invocation_route

    engines = SimpleNamespace(names=["m"], engines=[object()], capabilities=lambda name: caps)
    assert invocation_route(engines, body) == route  # type: ignore[arg-type]


def test_a_residual_colbert_dense_is_refused(tmp_path: Path) -> None:
    from ember.errors import ConfigError
    from ember.families.resolve import resolve_model
    from ember.heads.build import build_heads
    from ember.models.spec import ModelSpec
    from tests.fixtures.retrieval_models import build_tiny_colbert

    path = build_tiny_colbert(tmp_path / "colbert")
    config = path / "1_Dense" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "use_residual": True}))
    with pytest.raises(ConfigError, match="residual"):
        build_heads(resolve_model(ModelSpec(str(path))))
