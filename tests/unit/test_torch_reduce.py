"""A dense head's pooling on the device (``TokenBatch.reduce``) against the head's own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ember.backends import torch_varlen  # noqa: E402
from ember.backends.torch_reduce import reduce_padded, reduce_stream  # noqa: E402
from ember.batch import ATTENTION, TOKEN_STATES, TokenBatch, Tokens  # noqa: E402
from ember.engine.forward import Piece, run_batch  # noqa: E402
from ember.heads.dense import DEVICE_POOLINGS, DenseHead  # noqa: E402
from ember.heads.pooling import pool_numpy  # noqa: E402
from ember.processors.text import collate  # noqa: E402

LENGTHS = (5, 1, 12, 7)


def _states(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    states = rng.standard_normal((len(LENGTHS), max(LENGTHS), 6)).astype(np.float32)
    mask = np.zeros(states.shape[:2], dtype=np.int64)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    return states, mask


@pytest.mark.parametrize("mode", DEVICE_POOLINGS)
def test_padded_and_packed_reductions_equal_the_heads_pooling(mode: str) -> None:
    states, mask = _states()
    want = pool_numpy(states, mask, mode)  # type: ignore[arg-type]
    got = reduce_padded(torch.from_numpy(states), torch.from_numpy(mask), mode).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
    ids = np.ones_like(mask)
    packed = torch_varlen.pack(TokenBatch(ids, mask, np.zeros_like(ids)))
    stream = torch.from_numpy(states.reshape(-1, states.shape[-1])[packed.flat])
    got = reduce_stream(stream, torch.from_numpy(packed.cu_seqlens), mode).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)


def test_a_head_pools_a_reduced_row_into_itself() -> None:
    states, mask = _states(1)
    for mode in DEVICE_POOLINGS:
        pooled = pool_numpy(states, mask, mode)  # type: ignore[arg-type]
        again = pool_numpy(pooled[:, None, :], np.ones((len(LENGTHS), 1), np.int64), mode)  # type: ignore[arg-type]
        np.testing.assert_array_equal(again, pooled)


def test_only_a_single_plain_pooling_is_offered_to_the_backend() -> None:
    ids = np.ones((2, 3), dtype=np.int64)
    batch = TokenBatch(ids, ids, np.zeros_like(ids))
    assert DenseHead("mean").reduction(batch) == "mean"
    assert DenseHead("cls").reduction(batch) == "cls"
    assert DenseHead(("cls", "mean")).reduction(batch) is None  # concatenated modes
    assert DenseHead("weightedmean").reduction(batch) is None
    prompted = replace(batch, pool_from=np.array([2, 0]))
    assert DenseHead("mean", include_prompt=False).reduction(prompted) is None
    assert DenseHead("mean", include_prompt=True).reduction(prompted) == "mean"


class _Recording:
    """A backend that keeps the batch it was given and returns token states."""

    def __init__(self) -> None:
        self.batches: list[TokenBatch] = []

    def forward(self, batch: TokenBatch) -> dict[str, np.ndarray]:
        self.batches.append(batch)
        return {TOKEN_STATES: np.ones((*batch.shape, 4), dtype=np.float32)}


class _Processor:
    def collate(self, tokens: list[Tokens]) -> TokenBatch:
        return collate(tokens, pad_id=0)


def test_run_batch_asks_for_the_reduction_only_when_every_row_takes_it() -> None:
    backend = _Recording()
    heads = {"dense": DenseHead("mean"), "multi": DenseHead(("cls", "max"))}
    pieces = [Piece(Tokens([1, 2, 3], [0, 0, 0]), "dense"), Piece(Tokens([4], [0]), "dense")]
    rows = run_batch(_Processor(), backend, heads, pieces)  # type: ignore[arg-type]
    assert backend.batches[-1].reduce == "mean" and len(rows) == 2
    mixed = [*pieces[:1], Piece(Tokens([4], [0]), "multi")]
    run_batch(_Processor(), backend, heads, mixed)  # type: ignore[arg-type]
    assert backend.batches[-1].reduce is None


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_the_torch_backend_reduces_as_the_head_pools(
    monkeypatch: pytest.MonkeyPatch, minilm_path: Path, packed: bool, mode: str
) -> None:
    """The packaged MiniLM through the backend made to reduce on the CPU (as it does on a
    GPU), padded and packed: the head's vectors equal those from every token's states."""
    from ember.backends import torch_backend
    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec

    if packed:
        monkeypatch.setattr(torch_varlen, "unsupported_reason", lambda *a: None)
    backend = torch_backend.load(
        resolve_model(ModelSpec(model_id=str(minilm_path), backend="torch", device="cpu"))
    )
    assert backend.packed is packed and not backend.reduce_on_device
    tokens = [Tokens([101, *range(2000, 2000 + n), 102], [0] * (n + 2)) for n in (3, 40, 0, 17)]
    batch = collate(tokens, pad_id=0)
    head = DenseHead(mode)  # type: ignore[arg-type]
    rows = range(len(tokens))
    want = np.stack(head.split(backend.forward(batch), batch, rows))
    backend.reduce_on_device = True
    reduced_batch = replace(batch, reduce=head.reduction(batch))
    outputs = backend.forward(reduced_batch)
    assert outputs[TOKEN_STATES].shape == (4, 1, 384) and outputs[ATTENTION].shape == (4, 1)
    got = np.stack(head.split(outputs, reduced_batch, rows))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
