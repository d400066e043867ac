"""Cohere's embedding output types, computed from the normalised float vector.

Every type is a fixed function of one vector: no calibration ranges, nothing taken from
the other rows of the batch, so a text gets the same bytes alone or in any batch (a
per-batch range, as in sentence-transformers' ``quantize_embeddings`` without
``ranges``, would not). ``v`` is the float32 vector as returned (normalised, after any
``output_dimension`` cut), scaled in float64, rounded half to even (``np.rint``):

- ``float``:   v
- ``int8``:    rint(clip(127 * v, -128, 127))               int8, one per dimension
- ``uint8``:   rint(clip(127.5 * (v + 1), 0, 255))          uint8, one per dimension
- ``binary``:  packbits(v > 0) - 128                        int8, one per 8 dimensions
- ``ubinary``: packbits(v > 0)                              uint8, one per 8 dimensions
- ``base64``:  base64 of v as little-endian float32 bytes  one string per vector

``packbits`` is big-endian within a byte (dimension 0 is the high bit) and pads the
last byte with zero bits, so 9 dimensions give 2 bytes. Cohere's reference says only
that ``base64`` is "the float embedding bytes" appended and encoded, without width or
byte order; here it is float32 little-endian, the width of ``float`` and the same bytes
as OpenAI's ``encoding_format: "base64"`` (``np.frombuffer(b64decode(s), "<f4")``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, get_args

import numpy as np

from ember.outputs import DenseVectors

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
EMBEDDING_TYPES: tuple[str, ...] = get_args(EmbeddingType)


def _scaled(vectors: np.ndarray) -> np.ndarray:
    return np.asarray(vectors, dtype=np.float32).astype(np.float64)


def to_float(vectors: np.ndarray) -> np.ndarray:
    return np.asarray(vectors, dtype=np.float32)


def to_int8(vectors: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(127.0 * _scaled(vectors), -128, 127)).astype(np.int8)


def to_uint8(vectors: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(127.5 * (_scaled(vectors) + 1.0), 0, 255)).astype(np.uint8)


def to_ubinary(vectors: np.ndarray) -> np.ndarray:
    return np.packbits(np.asarray(vectors) > 0, axis=-1)


def to_binary(vectors: np.ndarray) -> np.ndarray:
    return (to_ubinary(vectors).astype(np.int16) - 128).astype(np.int8)


def to_base64(vectors: np.ndarray) -> list[str]:
    return DenseVectors(vectors).base64_rows()


_ENCODERS: dict[str, Callable[[np.ndarray], np.ndarray | list[str]]] = {
    "float": to_float,
    "int8": to_int8,
    "uint8": to_uint8,
    "binary": to_binary,
    "ubinary": to_ubinary,
    "base64": to_base64,
}


def encode_embeddings(vectors: np.ndarray, types: Iterable[str]) -> dict[str, list]:
    """[n, d] float32 vectors -> {type: n rows}, in the order asked, each type once.

    Numeric rows stay numpy arrays (orjson writes them as JSON lists); base64 rows are
    strings. An unknown type raises ValueError: requests are validated before this.
    """
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected [n, d] vectors, got shape {matrix.shape}")
    out: dict[str, list] = {}
    for name in types:
        if name in out:
            continue
        encoder = _ENCODERS.get(name)
        if encoder is None:
            known = ", ".join(EMBEDDING_TYPES)
            raise ValueError(f"unknown embedding type {name!r}; known: {known}")
        out[name] = list(encoder(matrix))
    return out
