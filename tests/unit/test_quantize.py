"""Cohere's output types: the documented formulas, by hand, and independent of the batch."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from ember.heads.quantize import EMBEDDING_TYPES, encode_embeddings

# 9 dimensions, so the binary types need a second, zero-padded byte.
V = np.array([[0.5, -0.5, 1.0, -1.0, 0.0, 0.25, -0.25, 0.1, -0.1]], dtype=np.float32)


def _rows(vectors: np.ndarray, kind: str) -> list:
    return [np.asarray(r).tolist() for r in encode_embeddings(vectors, [kind])[kind]]


def test_the_type_names() -> None:
    assert EMBEDDING_TYPES == ("float", "int8", "uint8", "binary", "ubinary", "base64")


def test_int8_by_hand() -> None:
    # 127 v = 63.5, -63.5, 127, -127, 0, 31.75, -31.75, 12.7, -12.7; halves round to even
    assert _rows(V, "int8") == [[64, -64, 127, -127, 0, 32, -32, 13, -13]]


def test_uint8_by_hand() -> None:
    # 127.5 (v + 1) = 191.25, 63.75, 255, 0, 127.5, 159.375, 95.625, 140.25, 114.75
    assert _rows(V, "uint8") == [[191, 64, 255, 0, 128, 159, 96, 140, 115]]


def test_binary_types_by_hand() -> None:
    # v > 0: 1 0 1 0 0 1 0 1 | 0 (+7 padding zeros) -> 0b10100101 = 165, 0
    assert _rows(V, "ubinary") == [[165, 0]]
    assert _rows(V, "binary") == [[165 - 128, 0 - 128]]


def test_float_and_base64_are_the_float32_vector() -> None:
    out = encode_embeddings(V, ["float", "base64"])
    assert np.asarray(out["float"][0]).dtype == np.float32
    np.testing.assert_array_equal(out["float"][0], V[0])
    (encoded,) = out["base64"]
    assert isinstance(encoded, str)
    raw = base64.b64decode(encoded)
    assert len(raw) == 4 * 9
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), V[0])


def test_dtypes_and_lengths() -> None:
    out = encode_embeddings(V, EMBEDDING_TYPES)
    assert list(out) == list(EMBEDDING_TYPES)
    expect = {
        "float": (np.float32, 9),
        "int8": (np.int8, 9),
        "uint8": (np.uint8, 9),
        "binary": (np.int8, 2),
        "ubinary": (np.uint8, 2),
    }
    for kind, (dtype, length) in expect.items():
        (row,) = out[kind]
        assert row.dtype == dtype and row.shape == (length,), kind


def test_extremes_clip() -> None:
    """A value past 1 (never from a normalised vector) still lands in range, not wraps."""
    v = np.array([[2.0, -2.0, 1.004, -1.008]], dtype=np.float32)
    assert _rows(v, "int8") == [[127, -128, 127, -128]]
    assert _rows(v, "uint8") == [[255, 0, 255, 0]]


def test_order_follows_the_request_and_repeats_collapse() -> None:
    out = encode_embeddings(V, ["ubinary", "float", "ubinary"])
    assert list(out) == ["ubinary", "float"]


def test_unknown_type_raises() -> None:
    with pytest.raises(ValueError, match="int4"):
        encode_embeddings(V, ["int4"])


def test_needs_a_matrix() -> None:
    with pytest.raises(ValueError, match="shape"):
        encode_embeddings(V[0], ["float"])


def test_empty_batch() -> None:
    out = encode_embeddings(np.zeros((0, 9), dtype=np.float32), EMBEDDING_TYPES)
    assert all(rows == [] for rows in out.values())


def test_independent_of_the_batch() -> None:
    """Each row's output is the same alone, in any batch, in any position."""
    rng = np.random.default_rng(0)
    batch = rng.standard_normal((16, 384)).astype(np.float32)
    batch /= np.linalg.norm(batch, axis=1, keepdims=True)
    whole = encode_embeddings(batch, EMBEDDING_TYPES)
    order = rng.permutation(len(batch))
    shuffled = encode_embeddings(batch[order], EMBEDDING_TYPES)
    for kind in EMBEDDING_TYPES:
        for i in range(len(batch)):
            alone = encode_embeddings(batch[i : i + 1], [kind])[kind][0]
            np.testing.assert_array_equal(np.asarray(whole[kind][i]), np.asarray(alone))
        for j, i in enumerate(order):
            np.testing.assert_array_equal(np.asarray(shuffled[kind][j]), np.asarray(whole[kind][i]))


def test_normalised_vectors_stay_in_cohere_ranges() -> None:
    rng = np.random.default_rng(1)
    batch = rng.standard_normal((64, 33)).astype(np.float32)
    batch /= np.linalg.norm(batch, axis=1, keepdims=True)
    out = encode_embeddings(batch, ["int8", "uint8", "binary", "ubinary"])
    int8 = np.stack(out["int8"]).astype(int)
    assert int8.min() >= -127 and int8.max() <= 127
    # the quantised vector points where the float one does
    for q, v in zip(int8, batch, strict=True):
        assert q @ v / np.linalg.norm(q) > 0.99
    # unpacking ubinary gives back the signs (33 dims -> 5 bytes, 7 padding bits)
    bits = np.unpackbits(np.stack(out["ubinary"]), axis=1)
    np.testing.assert_array_equal(bits[:, :33], batch > 0)
    assert not bits[:, 33:].any()
    np.testing.assert_array_equal(
        np.stack(out["binary"]).astype(int), np.stack(out["ubinary"]).astype(int) - 128
    )
