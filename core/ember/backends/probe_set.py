"""The near-exact check's fixed probe set (``ember.backends.near_exact``): texts of mixed
length, (query, document) pairs, and images of mixed size and content.

Fixed, so a cached verdict means the same thing on every machine; mixed, so short inputs,
inputs cut at the model's length, small and large images, smooth and noisy ones all count
(bf16's error grows with how far a forward's values spread).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PROBE_SIZE = 64

# Sentences of several kinds (prose, numbers, code, other scripts); the probe joins them
# into inputs of one to a few hundred tokens, so short and truncated inputs both count.
_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out at 02:56 UTC.",
    "def mean(xs): return sum(xs) / len(xs) if xs else 0.0",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都であり、人口は約1400万人です。",
    "Interest rates rose by 0.25 percentage points to 5.5% in July.",
    "What is the boiling point of water at sea level?",
    "Mitochondria are the powerhouse of the cell.",
    "SELECT name, COUNT(*) FROM orders GROUP BY name HAVING COUNT(*) > 3;",
    "La tour Eiffel mesure environ 330 mètres de haut.",
    "Rain is expected tomorrow afternoon, clearing by evening.",
    "Москва — столица России.",
    "A transformer encoder maps tokens to contextual vectors with self-attention.",
    "ok",
    "Customer reported that the app crashes when uploading files larger than 2 GB.",
)
# Image sizes (width, height): tiny, the towers' own 224, portrait, panorama, large.
_SIZES = ((32, 32), (224, 224), (180, 320), (640, 160), (500, 375), (97, 311), (800, 600))


def probe_texts() -> list[str]:
    """``PROBE_SIZE`` fixed inputs: input i joins 1 to 24 sentences from sentence i on."""
    n = len(_SENTENCES)
    lengths = [1 + (i * 7) % 24 for i in range(PROBE_SIZE)]
    return [" ".join(_SENTENCES[(i + j) % n] for j in range(k)) for i, k in enumerate(lengths)]


def probe_pairs() -> list[tuple[str, str]]:
    """``PROBE_SIZE`` (query, document) pairs for a classifier or reranker."""
    texts = probe_texts()
    return [
        (_SENTENCES[i % len(_SENTENCES)], texts[(i * 5) % len(texts)]) for i in range(len(texts))
    ]


def probe_images() -> list[Any]:
    """``PROBE_SIZE`` fixed RGB images: gradients, blocks of colour, stripes and noise (and
    mixes of them), in the sizes of ``_SIZES`` by turn."""
    from PIL import Image

    rng = np.random.default_rng(20261204)
    images = []
    for i in range(PROBE_SIZE):
        width, height = _SIZES[i % len(_SIZES)]
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        phase = rng.uniform(0, 2 * np.pi, 3)
        kind = i % 4
        if kind == 0:  # smooth colour gradients
            pixels = [127 + 127 * np.sin(x / width * 3 + y / height * 2 + p) for p in phase]
        elif kind == 1:  # blocks of flat colour
            cells = rng.integers(0, 256, (3, 8, 8)).astype(np.float32)
            rows, cols = (y * 8 // height).astype(int), (x * 8 // width).astype(int)
            pixels = [c[rows, cols] for c in cells]
        elif kind == 2:  # stripes at an angle
            freq = rng.uniform(0.05, 0.5)
            pixels = [127 + 127 * np.sign(np.sin((x + y * 0.5) * freq + p)) for p in phase]
        else:  # noise over a gradient
            noise = rng.normal(0, 40, (3, height, width))
            pixels = [
                127 + 60 * np.cos(y / height * 4 + p) + n for p, n in zip(phase, noise, strict=True)
            ]
        array = np.clip(np.stack(pixels, axis=-1), 0, 255).astype(np.uint8)
        images.append(Image.fromarray(array, "RGB"))
    return images
