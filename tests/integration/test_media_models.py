"""Images and audio through a real `ember serve`: CLIP, SigLIP, CLAP, ColPali and ColQwen2
(tiny seeded models saved with their own processors, tests/fixtures/media_models.py)
against transformers' own outputs on the same weights and the same decoded inputs
(tests/fixtures/media_references.py), cosine >= 0.9999 in fp32; Infinity's and Cohere's
request shapes; and the fetching and decoding catalog, each a clear 4xx with the server
healthy after."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import media_references as ref
from tests.fixtures.media_models import (
    build_st_clip,
    build_tiny_clap,
    build_tiny_clip,
    build_tiny_colpali,
    build_tiny_colqwen2,
    build_tiny_siglip,
)
from tests.fixtures.media_server import MediaServer, media_server
from tests.support import ServerProcess, start_server

COSINE = 0.9999
TEXTS = ["a photo of a cat", "two dogs playing in the snow", "x"]
# The retrieval VLMs again with a short language model (positions), so a query past their
# max length costs a small forward: ColPali's 8,192 and ColQwen2's 32,768 would not.
SHORT_POSITIONS = 128


def _with_positions(path: Path, positions: int) -> Path:
    """``path``'s model with its language model's ``max_position_embeddings`` set (its
    rotary positions are computed, so the weights serve any length)."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["vlm_config"]["text_config"]["max_position_embeddings"] = positions
    config_file.write_text(json.dumps(config, indent=2))
    return path


def _image(width: int, height: int, seed: int) -> object:
    """A deterministic image with structure at every scale (noise over a gradient)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 / width, ys * 255 / height, (xs + ys) % 256], axis=-1)
    pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def _encode(image: object, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)  # type: ignore[attr-defined]
    return out.getvalue()


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _decoded(data: bytes) -> object:
    """What the server decodes from ``data``: the same Pillow, RGB."""
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


# Images of several sizes and formats: each is resized and cropped by the processor.
IMAGES = {
    "wide.png": _encode(_image(96, 48, 1), "PNG"),
    "tall.jpg": _encode(_image(40, 90, 2), "JPEG"),
    "square.webp": _encode(_image(64, 64, 3), "WEBP"),
}
MIMES = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp"}


def _uris() -> list[str]:
    return [_data_uri(data, MIMES[name.rsplit(".", 1)[1]]) for name, data in IMAGES.items()]


def _decoded_images() -> list[object]:
    return [_decoded(data) for data in IMAGES.values()]


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("media")
    return {
        "clip": build_tiny_clip(root / "clip"),
        "siglip": build_tiny_siglip(root / "siglip"),
        "clap": build_tiny_clap(root / "clap"),
        "colpali": build_tiny_colpali(root / "colpali"),
        "colqwen2": build_tiny_colqwen2(root / "colqwen2"),
        "st-clip": build_st_clip(root / "st-clip", "st6"),
        "st-clip-legacy": build_st_clip(root / "st-clip-legacy", "legacy"),
        "colpali-short": _with_positions(build_tiny_colpali(root / "cps"), SHORT_POSITIONS),
        "colqwen2-short": _with_positions(build_tiny_colqwen2(root / "cqs"), SHORT_POSITIONS),
    }


@pytest.fixture(scope="module")
def files() -> Iterator[MediaServer]:
    served = {f"/{name}": (MIMES[name.rsplit(".", 1)[1]], data) for name, data in IMAGES.items()}
    served["/notes.txt"] = ("image/png", b"this is text, not an image\n" * 20)
    with media_server(served) as httpd:
        yield httpd


@pytest.fixture(scope="module")
def server(paths: dict[str, Path], minilm_path: Path) -> Iterator[ServerProcess]:
    """Media models beside a text model, fetching allowed to this machine's test server;
    every model on torch (the towers as transformers runs them)."""
    names = ("clip", "siglip", "clap", "colpali", "colqwen2", "st-clip", "st-clip-legacy")
    names += ("colpali-short", "colqwen2-short")
    models = ";".join([*(str(paths[n]) for n in names), str(minilm_path)])
    with start_server(
        [
            "--model-id",
            models,
            "--served-model-name",
            ";".join([*names, "minilm"]),
            "--backend",  # auto serves CLIP on onnx: tests/integration/test_onnx_media.py
            "torch",
            "--allow-private-urls",
            "--max-media-bytes",
            "300000",
            "--media-fetch-timeout",
            "1",
        ]
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def strict(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    """The defaults: no private addresses."""
    with start_server(["--model-id", str(paths["clip"]), "--served-model-name", "clip"]) as s:
        yield s


def post(server: ServerProcess, path: str, body: dict) -> dict:
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def embeddings(server: ServerProcess, model: str, inputs: list, modality: str) -> np.ndarray:
    body = post(server, "/v1/embeddings", {"model": model, "input": inputs, "modality": modality})
    return np.array([row["embedding"] for row in body["data"]])


def refused(server: ServerProcess, path: str, body: dict, status: int = 400) -> str:
    """The OpenAI error shape, and the server still healthy after."""
    with server.client() as client:
        response = client.post(path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == status
        assert client.get("/health").status_code == 200
    return str(error["message"])


# ------------------------------------------------------------------------------ CLIP


def test_clip_text_matches_transformers(server: ServerProcess, paths: dict[str, Path]) -> None:
    got = embeddings(server, "clip", TEXTS, "text")
    assert cosines(got, ref.clip_text(paths["clip"], TEXTS)).min() >= COSINE
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # normalised, as Infinity


def test_clip_images_match_transformers(server: ServerProcess, paths: dict[str, Path]) -> None:
    got = embeddings(server, "clip", _uris(), "image")
    assert cosines(got, ref.clip_images(paths["clip"], _decoded_images())).min() >= COSINE
    # one at a time gives the same vectors as a batch of three
    alone = np.vstack([embeddings(server, "clip", [uri], "image") for uri in _uris()])
    assert cosines(alone, got).min() >= COSINE


@pytest.mark.parametrize("name", ["st-clip", "st-clip-legacy"])
def test_sentence_transformers_clip_matches_its_encode(
    server: ServerProcess, paths: dict[str, Path], name: str
) -> None:
    """sentence-transformers' own CLIP formats (6.x's Transformer save, and the CLIPModel
    module clip-ViT-B-32 was saved with) serve as CLIP, equal to SentenceTransformer.encode
    of the same texts and decoded images (the reference library, installed beside Ember)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(paths[name]), device="cpu")
    listed = {m["id"]: m for m in post_get(server, "/v1/models")["data"]}
    assert listed[name]["kind"] == "clip"
    assert "image_embed" in listed[name]["capabilities"]
    got = embeddings(server, name, TEXTS, "text")
    assert cosines(got, model.encode(TEXTS)).min() >= COSINE
    got = embeddings(server, name, _uris(), "image")
    assert cosines(got, model.encode(_decoded_images())).min() >= COSINE


def post_get(server: ServerProcess, path: str) -> dict:
    with server.client() as client:
        response = client.get(path)
    assert response.status_code == 200, response.text
    return response.json()


def test_clip_image_urls_equal_data_uris(server: ServerProcess, files: MediaServer) -> None:
    urls = [f"{files.url}/{name}" for name in IMAGES]
    redirected = [f"{files.url}/redirect/3/{name}" for name in IMAGES]  # 3 hops: allowed
    by_uri = embeddings(server, "clip", _uris(), "image")
    assert cosines(embeddings(server, "clip", urls, "image"), by_uri).min() >= 0.999999
    assert cosines(embeddings(server, "clip", redirected, "image"), by_uri).min() >= 0.999999


def test_infinity_legacy_image_route_and_models(server: ServerProcess) -> None:
    legacy = post(server, "/embeddings_image", {"model": "clip", "input": _uris()})
    got = np.array([row["embedding"] for row in legacy["data"]])
    assert cosines(got, embeddings(server, "clip", _uris(), "image")).min() >= 0.999999
    with server.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["clip"]["capabilities"] == ["embed", "image_embed"]
    assert "image_embed" not in models["minilm"]["capabilities"]


def test_openai_sdk_extra_body_modality(server: ServerProcess, paths: dict[str, Path]) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    reply = client.embeddings.create(model="clip", input=_uris(), extra_body={"modality": "image"})
    got = np.array([row.embedding for row in reply.data])
    assert cosines(got, ref.clip_images(paths["clip"], _decoded_images())).min() >= COSINE


def test_cohere_v2_embed_images(server: ServerProcess, paths: dict[str, Path]) -> None:
    body = post(
        server,
        "/v2/embed",
        {"model": "clip", "images": _uris(), "input_type": "image", "embedding_types": ["float"]},
    )
    got = np.array(body["embeddings"]["float"])
    assert cosines(got, ref.clip_images(paths["clip"], _decoded_images())).min() >= COSINE


# ------------------------------------------------------------------------------ SigLIP


def test_siglip_text_and_images_match_transformers(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    """SigLIP's text is padded to its max length as its processor documents (SPEC-NOTES):
    a server padding to the longest text in the batch fails this on the short texts."""
    text = embeddings(server, "siglip", TEXTS, "text")
    assert cosines(text, ref.siglip_text(paths["siglip"], TEXTS)).min() >= COSINE
    images = embeddings(server, "siglip", _uris(), "image")
    assert cosines(images, ref.siglip_images(paths["siglip"], _decoded_images())).min() >= COSINE


# ------------------------------------------------------------------------------ CLAP

CLAP_RATE = 48_000


def _tone(seconds: float, frequency: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.3 * np.sin(2 * np.pi * frequency * t) * np.exp(-t)  # a decaying tone
    return np.stack([wave] * channels, axis=-1) if channels > 1 else wave


def _wav(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, samples, rate, format=fmt)
    return out.getvalue()


def _read(data: bytes) -> tuple[np.ndarray, int]:
    """What the audio reads as: soundfile's float32, channels averaged."""
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples.mean(axis=1), rate


def test_clap_text_and_audio_match_transformers(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    text = embeddings(server, "clap", TEXTS, "text")
    assert cosines(text, ref.clap_text(paths["clap"], TEXTS)).min() >= COSINE
    clips = [
        _wav(_tone(1.0, 440, CLAP_RATE), CLAP_RATE),
        _wav(_tone(2.5, 880, CLAP_RATE, channels=2), CLAP_RATE, "FLAC"),  # stereo -> mono
    ]
    got = embeddings(server, "clap", [_data_uri(c, "audio/wav") for c in clips], "audio")
    want = ref.clap_audio(paths["clap"], [_read(c)[0] for c in clips])
    assert cosines(got, want).min() >= COSINE


def test_clap_resamples_other_rates(server: ServerProcess, paths: dict[str, Path]) -> None:
    """A 44.1 kHz WAV is resampled to the model's 48 kHz (soxr, HQ), not refused."""
    import soxr

    clip = _wav(_tone(1.5, 660, 44_100), 44_100)
    got = embeddings(server, "clap", [_data_uri(clip, "audio/wav")], "audio")
    samples, rate = _read(clip)
    want = ref.clap_audio(paths["clap"], [soxr.resample(samples, rate, CLAP_RATE)])
    assert cosines(got, want).min() >= COSINE
    legacy = post(server, "/embeddings_audio", {"model": "clap", "input": _data_uri(clip, "a/w")})
    assert cosines(np.array([legacy["data"][0]["embedding"]]), got).min() >= 0.999999


def test_clap_long_clip_is_deterministic(server: ServerProcess) -> None:
    """Past its 10 s window CLAP's extractor crops at random: one clip, one vector."""
    clip = _data_uri(_wav(_tone(12.0, 300, 8000), 8000), "audio/wav")  # small enough to send
    first = embeddings(server, "clap", [clip], "audio")
    assert np.array_equal(first, embeddings(server, "clap", [clip], "audio"))


# ------------------------------------------------------------------------------ ColPali, ColQwen2

QUERIES = ["what is the revenue in 2023?", "a chart of cats"]


def multi(server: ServerProcess, model: str, inputs: list, modality: str) -> list[np.ndarray]:
    body = post(server, "/v1/embeddings", {"model": model, "input": inputs, "modality": modality})
    return [np.array(row["embedding"]) for row in body["data"]]


@pytest.mark.parametrize("kind", ["colpali", "colqwen2"])
def test_late_interaction_pages_and_queries(
    server: ServerProcess, paths: dict[str, Path], kind: str
) -> None:
    """One vector per position of each input processed alone (prefix, image and
    augmentation tokens included, batch padding never: SPEC-NOTES), queries and pages."""
    queries = multi(server, kind, QUERIES + ["x"], "text")
    want = getattr(ref, f"{kind}_queries")(paths[kind], QUERIES + ["x"])
    for got, expected in zip(queries, want, strict=True):
        assert cosines(got, expected).min() >= COSINE
    pages = multi(server, kind, _uris(), "image")
    want_pages = getattr(ref, f"{kind}_images")(paths[kind], _decoded_images())
    for got, expected in zip(pages, want_pages, strict=True):
        assert cosines(got, expected).min() >= COSINE
    # MaxSim of a text query against page images on the rerank route
    body = post(
        server,
        "/v1/rerank",
        {"model": kind, "query": QUERIES[0], "documents": _uris(), "modality": "image"},
    )
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    expected_scores = [ref.maxsim(want[0], page) for page in want_pages]
    assert np.allclose([scores[i] for i in range(len(want_pages))], expected_scores, rtol=1e-4)
    with server.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {"embed", "image_embed", "rerank"} <= set(models[kind]["capabilities"])


@pytest.mark.parametrize("kind", ["colpali-short", "colqwen2-short"])
def test_a_2mb_query_embeds_as_its_cut_by_hand(server: ServerProcess, kind: str) -> None:
    """Cut before tokenising (ember.families.vlm.queries): a 1.9 MB query (the largest a
    2 MB body holds) embeds as its first 6,400 characters do, the model's max length of
    vectors; with truncate false it is refused, the server healthy after."""
    long = "word " * 380_000
    (whole,) = multi(server, kind, [long], "text")
    (by_hand,) = multi(server, kind, [long[: 50 * SHORT_POSITIONS]], "text")
    assert whole.shape[0] == SHORT_POSITIONS and np.array_equal(whole, by_hand)
    body = {"model": kind, "input": [long], "truncate": False}
    message = refused(server, "/v1/embeddings", body)
    assert "input 0: more than" in message and f"({SHORT_POSITIONS})" in message


# ------------------------------------------------------------------------------ the catalog


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:{port}/wide.png",
        "http://[::1]:{port}/wide.png",
        "http://0.0.0.0:{port}/wide.png",
        "http://2130706433:{port}/wide.png",  # 127.0.0.1 written as one decimal integer
        "http://127.0.0.1:{port}/wide.png",
        "file:///etc/passwd",
        "gopher://127.0.0.1:{port}/_",
    ],
)
def test_ssrf_refused_by_default(strict: ServerProcess, files: MediaServer, url: str) -> None:
    bad = url.format(port=files.port)
    message = refused(strict, "/v1/embeddings", {"input": [_uris()[0], bad], "modality": "image"})
    assert message.startswith("input 1:"), message


def _catalog() -> list[tuple[str, int, str]]:
    """(input, status, words in the message) for media that fails after fetching."""
    from PIL import Image

    jpeg = IMAGES["tall.jpg"]
    bomb = _encode(Image.new("RGB", (8, 8)), "PNG")
    # The IHDR chunk claims 50,000 x 50,000 pixels (its CRC recomputed): 2.5 gigapixels.
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", 50_000, 50_000, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    bomb = bomb[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    bomb += _encode(Image.new("RGB", (8, 8)), "PNG")[33:]
    return [
        (_data_uri(bomb, "image/png"), 400, "pixels"),
        (_data_uri(jpeg[: len(jpeg) // 2], "image/jpeg"), 400, "input 1"),
        (_data_uri(b"plain words", "image/png"), 400, "input 1"),
        ("data:image/png;base64,@@@not-base64@@@", 400, "input 1"),
    ]


@pytest.mark.parametrize("case", range(4))
def test_undecodable_media_is_400(server: ServerProcess, case: int) -> None:
    item, status, words = _catalog()[case]
    body = {"model": "clip", "input": [_uris()[0], item], "modality": "image"}
    message = refused(server, "/v1/embeddings", body)
    assert message.startswith("input 1:") and words in message, message


def test_fetch_failures(server: ServerProcess, files: MediaServer) -> None:
    def bad(url: str, status: int = 400) -> str:
        body = {"model": "clip", "input": [url], "modality": "image"}
        message = refused(server, "/v1/embeddings", body, status)
        assert message.startswith("input 0:"), message
        return message

    bad(f"{files.url}/notes.txt")  # text served as an image
    bad(f"{files.url}/missing.png")  # 404
    assert "404" in bad(f"{files.url}/missing.png")
    bad(f"{files.url}/redirect/4/wide.png")  # a 4th redirect
    bad(f"{files.url}/endless", 413)  # streams past --max-media-bytes
    bad(f"{files.url}/never")  # --media-fetch-timeout 1: 400, not 504


def test_media_to_text_model_names_what_it_serves(server: ServerProcess) -> None:
    message = refused(
        server, "/v1/embeddings", {"model": "minilm", "input": _uris(), "modality": "image"}
    )
    assert "does not take image input" in message and "dense embeddings" in message
    message = refused(
        server, "/v1/embeddings", {"model": "clip", "input": _uris(), "modality": "audio"}
    )
    assert "does not take audio input" in message and "images" in message
