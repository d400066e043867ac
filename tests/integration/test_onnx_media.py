"""CLIP and SigLIP on ONNX Runtime through a real `ember serve --backend onnx`: each tower
its own graph, against transformers' ``get_text_features`` / ``get_image_features`` on the
same weights and decoded inputs (tests/fixtures/media_references.py).

Stated tolerances (worst cosine per vector):
  fp32  >= 0.9999, as every backend (measured 1.000000 on tiny CLIP, tiny SigLIP and
        ViT-B/32);
  int8  >= 0.999 (measured worst: tiny CLIP 0.99997 text / 0.99999 images, tiny SigLIP
        0.99999 / 0.99997, ViT-B/32 0.99984 / 0.99997). These are seeded random weights,
        which have none of the outlier channels of trained checkpoints; onnx_int8's rule
        measured 0.993 on trained MiniLM, so a real checkpoint's own figure may be lower.
        Those are an AVX512-VNNI host's (int8 weights); on AVX2 without VNNI Ember writes
        uint8 weights (onnx_int8.cpu_int8_weights): 0.99998 / 0.99999 and 0.99999 /
        0.99998 with these tests' servers under ``EMBER_TEST_CPU_EMULATOR="qemu-x86_64
        -cpu Haswell"``, where int8 weights gave CLIP 0.9958 / 0.9989.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import media_references as ref
from tests.fixtures.media_models import build_clip_vit_b32, build_tiny_clip, build_tiny_siglip
from tests.integration.test_media_models import (
    TEXTS,
    _data_uri,
    _decoded,
    _decoded_images,
    _encode,
    _image,
    _uris,
    cosines,
    embeddings,
)
from tests.support import ServerProcess, start_server

FP32_COSINE = 0.9999
INT8_COSINE = 0.999
KINDS = ("clip", "siglip")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx-media")
    return {"clip": build_tiny_clip(root / "clip"), "siglip": build_tiny_siglip(root / "siglip")}


@pytest.fixture(scope="module", params=["float32", "int8"])
def served(
    request: pytest.FixtureRequest, paths: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    cache = tmp_path_factory.mktemp(f"cache-{request.param}")
    args = ["--model-id", ";".join(str(paths[k]) for k in KINDS)]
    args += ["--served-model-name", ";".join(KINDS), "--backend", "onnx", "--device", "cpu"]
    args += ["--dtype", request.param, "--cache-dir", str(cache)]
    with start_server(args) as server:
        yield server, request.param


def _reference(kind: str, path: Path, modality: str) -> np.ndarray:
    if modality == "text":
        return getattr(ref, f"{kind}_text")(path, TEXTS)
    return getattr(ref, f"{kind}_images")(path, _decoded_images())


@pytest.mark.parametrize("modality", ["text", "image"])
@pytest.mark.parametrize("kind", KINDS)
def test_towers_match_transformers(
    served: tuple[ServerProcess, str], paths: dict[str, Path], kind: str, modality: str
) -> None:
    server, dtype = served
    inputs = TEXTS if modality == "text" else _uris()
    got = embeddings(server, kind, inputs, modality)
    want = _reference(kind, paths[kind], modality)
    worst = cosines(got, want).min()
    assert worst >= (FP32_COSINE if dtype == "float32" else INT8_COSINE), worst
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # One at a time (CLIP's text padded to its own length) gives the batch's vectors; int8
    # within its tolerance, as its activation ranges are taken per batch.
    alone = np.vstack([embeddings(server, kind, [item], modality) for item in inputs])
    assert cosines(alone, got).min() >= (0.99999 if dtype == "float32" else INT8_COSINE)


def test_served_by_onnx_towers(served: tuple[ServerProcess, str]) -> None:
    """The answers above came from ONNX Runtime at the dtype asked for, each tower its own
    graph; int8 really is quantised (its vectors differ from transformers')."""
    server, dtype = served
    with server.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    for kind in KINDS:
        row = models[kind]
        assert (row["backend"], row["dtype"], row["device"]) == ("onnx", dtype, "cpu"), row
        assert row["backend_details"]["towers"] == "text,image"
        assert row["backend_details"]["artifact"].startswith("onnx/"), row
    log = server.log()
    for kind in KINDS:
        assert f"building ONNX towers for {kind}" in log
    if dtype == "int8":  # every tower had MatMuls quantised
        assert "int8 nodes: {'text': 0" not in log and "'image': 0}" not in log
        assert "int8 nodes: {'text': " in log


@pytest.mark.slow
def test_clip_vit_b32_fp32_and_int8(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The real ViT-B/32 shapes (12 layers, 224 px, 77 tokens; seeded weights) through the
    engine: fp32 at the parity bar, int8 at the stated tolerance."""
    from ember.engine import SyncEngineArray

    path = build_clip_vit_b32(tmp_path_factory.mktemp("b32") / "clip-b32")
    sizes = [(224, 224), (320, 240), (96, 48), (500, 300)]
    images = [_encode(_image(w, h, seed), "PNG") for seed, (w, h) in enumerate(sizes)]
    uris = [_data_uri(data, "image/png") for data in images]
    want_text = ref.clip_text(path, TEXTS)
    want_images = ref.clip_images(path, [_decoded(data) for data in images])
    cache = tmp_path_factory.mktemp("b32-cache")
    for dtype, bar in (("float32", FP32_COSINE), ("int8", INT8_COSINE)):
        with SyncEngineArray(
            model_id=[str(path)], backend="onnx", dtype=dtype, device="cpu", cache_dir=str(cache)
        ) as ember:
            text = ember.embed(TEXTS)
            pictures = ember.embed(uris, modality="image")
        assert cosines(text, want_text).min() >= bar, dtype
        assert cosines(pictures, want_images).min() >= bar, dtype


def test_auto_serves_clip_on_onnx_and_siglip_on_torch(
    paths: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`--backend auto` on a CPU (choice.py: CLIP measured faster on onnx, SigLIP not),
    each at the fp32 bar: on the exact path (``--dtype float32``), on any CPU kind (auto's
    near-exact towers: tests/unit/test_near_exact.py)."""
    args = ["--model-id", ";".join(str(paths[k]) for k in KINDS)]
    args += ["--served-model-name", ";".join(KINDS), "--device", "cpu", "--dtype", "float32"]
    args += ["--cache-dir", str(tmp_path_factory.mktemp("cache-auto"))]
    with start_server(args) as server:
        with server.client() as client:
            models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["clip"]["backend"] == "onnx", models["clip"]
        assert models["siglip"]["backend"] == "torch", models["siglip"]
        for kind in KINDS:
            for modality, inputs in (("text", TEXTS), ("image", _uris())):
                got = embeddings(server, kind, inputs, modality)
                want = _reference(kind, paths[kind], modality)
                assert cosines(got, want).min() >= FP32_COSINE, (kind, modality)
