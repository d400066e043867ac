"""Packed (unpadded) forwards against the padded ones they replace on CUDA.

On CPU the packed attention runs each row alone with SDPA (the kernel itself is CUDA's),
so what these tests check is the packing: lengths, cu_seqlens, each row's positions
(RoBERTa's offset, rotary), token types, causal and sliding windows, grouped key/value
heads, and the states scattered back to the padded rows the heads pool. The padded forward
is transformers' own SDPA path on the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ember.backends import torch_varlen  # noqa: E402
from ember.backends.base import PaddingBudget  # noqa: E402
from ember.batch import TOKEN_STATES, TokenBatch  # noqa: E402
from ember.engine.batcher import WorkItem, batch_cost, take_batch  # noqa: E402

LENGTHS = (13, 3, 20, 1, 7)  # longer than the sliding windows below, and a row of one


def _batch(lengths: tuple[int, ...], vocab: int, seed: int = 0) -> TokenBatch:
    rng = np.random.default_rng(seed)
    seq = max(lengths)
    ids = np.zeros((len(lengths), seq), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(3, vocab, length)
        mask[row, :length] = 1
        types[row, length // 2 : length] = 1  # a pair's second segment
    return TokenBatch(ids, mask, types)


def test_pack_keeps_each_rows_tokens_positions_and_types() -> None:
    batch = _batch(LENGTHS, vocab=50)
    packed = torch_varlen.pack(batch, position_offset=2)
    assert packed.tokens == sum(LENGTHS)
    assert packed.cu_seqlens.tolist() == [0, 13, 16, 36, 37, 44]
    assert packed.cu_seqlens.dtype == np.int32
    assert packed.max_length == 20 and (packed.rows, packed.seq) == (5, 20)
    for row, length in enumerate(LENGTHS):
        lo, hi = packed.cu_seqlens[row], packed.cu_seqlens[row + 1]
        assert packed.ids[lo:hi].tolist() == batch.input_ids[row, :length].tolist()
        assert packed.token_types[lo:hi].tolist() == batch.token_type_ids[row, :length].tolist()
        assert packed.positions[lo:hi].tolist() == list(range(2, 2 + length))
        assert packed.flat[lo:hi].tolist() == [row * 20 + c for c in range(length)]


def test_unpack_puts_states_back_in_their_rows_with_zeros_at_padding() -> None:
    batch = _batch(LENGTHS, vocab=50)
    packed = torch_varlen.pack(batch)
    stream = torch.arange(packed.tokens * 3, dtype=torch.float32).reshape(-1, 3)
    padded = torch_varlen.unpack(stream, packed).numpy()
    assert padded.shape == (5, 20, 3)
    for row, length in enumerate(LENGTHS):
        lo = packed.cu_seqlens[row]
        np.testing.assert_array_equal(padded[row, :length], stream[lo : lo + length].numpy())
        assert not padded[row, length:].any()


def test_a_mask_with_holes_is_told_apart() -> None:
    mask = np.array([[1, 1, 0], [1, 0, 1]])
    assert torch_varlen.has_holes(mask)
    assert not torch_varlen.has_holes(np.array([[1, 1, 0], [1, 0, 0]]))


SMALL = {"vocab_size": 60, "hidden_size": 32, "max_position_embeddings": 64}
# name -> (transformers config class, model class, config, model keywords): each scaled down
# but keeping what packing must get right.
NETWORKS: dict[str, tuple[str, str, dict[str, object], dict[str, object]]] = {
    "bert": (  # token types
        "BertConfig", "BertModel",
        {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
         "type_vocab_size": 2},
        {"add_pooling_layer": False},
    ),
    "xlm-roberta": (  # positions from padding_idx + 1
        "XLMRobertaConfig", "XLMRobertaModel",
        {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
         "pad_token_id": 1, "type_vocab_size": 1},
        {"add_pooling_layer": False},
    ),
    "modernbert": (  # rotary; a sliding window of 4 each side, crossed by rows of 13 and 20
        "ModernBertConfig", "ModernBertModel",
        {"num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 48,
         "local_attention": 8, "global_attn_every_n_layers": 3, "pad_token_id": 0},
        {},
    ),
    "qwen3": (  # causal, grouped key/value heads
        "Qwen3Config", "Qwen3Model",
        {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "intermediate_size": 48},
        {},
    ),
    "gemma3": (  # bidirectional sliding window, one key/value head
        "Gemma3TextConfig", "Gemma3TextModel",
        {"intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 16, "query_pre_attn_scalar": 16,
         "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5,
         "use_bidirectional_attention": True, "pad_token_id": 0},
        {},
    ),
}  # fmt: skip


def _network(name: str) -> tuple[object, int]:
    config_class, model_class, config, extra = NETWORKS[name]
    config_type = getattr(transformers, config_class)
    return getattr(transformers, model_class)(config_type(**SMALL, **config), **extra), 60


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_packed_forward_gives_each_row_its_padded_forwards_states(name: str) -> None:
    torch.manual_seed(0)
    net, vocab = _network(name)
    net.set_attn_implementation("sdpa")
    net.eval()
    batch = _batch(LENGTHS, vocab)
    takes_types = net.config.model_type == "bert"
    with torch.inference_mode():
        padded_kwargs = {
            "input_ids": torch.from_numpy(batch.input_ids),
            "attention_mask": torch.from_numpy(batch.attention_mask),
        }
        if takes_types:
            padded_kwargs["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
        expected = net(**padded_kwargs).last_hidden_state.numpy()

        net.set_attn_implementation(torch_varlen.register())
        assert net.config._attn_implementation == torch_varlen.ATTENTION_NAME
        packed = torch_varlen.pack(batch, torch_varlen.position_offset(net))
        kwargs = torch_varlen.packed_inputs(packed, torch.from_numpy)
        if not takes_types:
            del kwargs["token_type_ids"]
        stream = net(**kwargs).last_hidden_state[0]
        got = torch_varlen.unpack(stream, packed).numpy()
    assert net.config.model_type in torch_varlen.PACKABLE_MODEL_TYPES
    assert got.shape == expected.shape
    for row, length in enumerate(LENGTHS):
        np.testing.assert_allclose(got[row, :length], expected[row, :length], atol=2e-5, rtol=0)
        # what the heads pool: mean over the row's tokens, and its first and last token
        np.testing.assert_allclose(
            got[row, :length].mean(0), expected[row, :length].mean(0), atol=2e-5, rtol=0
        )


def test_roberta_rows_count_positions_from_padding_idx_plus_one() -> None:
    net, _ = _network("xlm-roberta")
    assert torch_varlen.position_offset(net) == 2
    bert, _ = _network("bert")
    assert torch_varlen.position_offset(bert) == 0


def test_the_cpu_stays_padded_and_says_why() -> None:
    net, _ = _network("bert")
    reason = torch_varlen.unsupported_reason(net, "cpu", torch.float32)
    assert reason == "packed forwards run on CUDA (padded SDPA elsewhere)"


def test_the_torch_backend_packed_on_minilm_matches_its_padded_forward(
    monkeypatch: pytest.MonkeyPatch, minilm_path: Path
) -> None:
    """The backend's whole packed path (pack, copy, forward, scatter) on the packaged
    MiniLM, made to take it on the CPU, against the same backend padded."""
    from ember.backends import torch_backend
    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec

    spec = ModelSpec(model_id=str(minilm_path), backend="torch", device="cpu")
    padded_backend = torch_backend.load(resolve_model(spec))
    assert not padded_backend.packed
    assert padded_backend.info.details["unpadded"].startswith("no: packed forwards run on CUDA")
    monkeypatch.setattr(torch_varlen, "unsupported_reason", lambda *a: None)
    packed_backend = torch_backend.load(resolve_model(spec))
    assert packed_backend.packed and packed_backend.padding.packed
    assert not packed_backend.masked_positions
    batch = _batch((9, 31, 2, 17), vocab=30_000, seed=3)
    want = padded_backend.forward(batch)[TOKEN_STATES]
    got = packed_backend.forward(batch)[TOKEN_STATES]
    mask = batch.attention_mask.astype(bool)
    np.testing.assert_allclose(got[mask], want[mask], atol=3e-5, rtol=0)
    assert not got[~mask].any()


class _Item:
    def __init__(self, cost: int) -> None:
        self.cost, self.key = cost, None


def _work(costs: list[int]) -> list[WorkItem]:
    return [WorkItem(_Item(c), future=None) for c in costs]  # type: ignore[arg-type]


def test_packed_batches_are_cut_by_real_tokens_with_no_padding_slack() -> None:
    costs = [500, 20, 480, 30, 60, 400]
    packed = PaddingBudget(tokens=0, fraction=0.0, packed=True)
    batch, rest = take_batch(_work(costs), max_tokens=1000, max_size=32, padding=packed)
    taken = [it.item.cost for it in batch]
    assert taken == [500, 20, 480]  # oldest first, each that still fits: 1,000 exactly
    assert [it.item.cost for it in rest] == [30, 60, 400]
    assert batch_cost([it.item for it in batch], packed) == 1000
    # padded, the same queue pays for its longest row in every slot
    padded = PaddingBudget(tokens=4096, fraction=0.1)
    batch, _ = take_batch(_work(costs), max_tokens=1000, max_size=32, padding=padded)
    assert batch_cost([it.item for it in batch], padded) <= 1000
    assert len(batch) == 2  # 500 and its neighbour, padded to 2 x 500


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_half_precision_runs_packed_within_its_tolerance(
    minilm_path: Path, dtype: str
) -> None:
    """On a GPU the backend takes PyTorch's varlen kernel; each row's mean-pooled states
    stay within half precision's tolerance (cosine >= 0.999) of fp32 padded on the CPU."""
    from ember.backends import torch_backend
    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec

    cuda = torch_backend.load(
        resolve_model(ModelSpec(model_id=str(minilm_path), device="cuda", dtype=dtype))
    )
    assert cuda.packed, cuda.unpadded_reason
    cpu = torch_backend.load(resolve_model(ModelSpec(model_id=str(minilm_path), device="cpu")))
    batch = _batch((9, 31, 2, 17, 128), vocab=30_000, seed=4)
    mask = batch.attention_mask[..., None].astype(np.float32)
    got = (cuda.forward(batch)[TOKEN_STATES] * mask).sum(1)
    want = (cpu.forward(batch)[TOKEN_STATES] * mask).sum(1)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.999
