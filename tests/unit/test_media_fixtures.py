"""The media fixtures: each tiny model's directory loads through the normal classes, its
processor keeps the semantics the server must reproduce (CLIP's eos pooling ids, SigLIP's
64-token padding and input_ids-only output, CLAP's 48 kHz extractor, the Col* prompts),
the references run, have the documented shapes, separate different inputs, and every
build is byte-identical to the next. The samples are deterministic and decode as stated.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import media_models as mm
from tests.fixtures import media_references as ref
from tests.fixtures import media_samples as ms

TEXTS = ["a photo of a cat", "a photo of a dog", "Über-long, punctuated text!", "x"]
QUERIES = ["where is the cat", "a red page"]
KINDS = ("clip", "siglip", "clap", "colpali", "colqwen2")
BUILDERS = {kind: getattr(mm, f"build_tiny_{kind}") for kind in KINDS}


def _images() -> list:
    images = ms.sample_images()
    return [images[n] for n in ("gradient_square", "shapes_wide", "gradient_tall", "grey")]


def _clips() -> list[np.ndarray]:
    return list(ms.sample_clips().values())


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _assert_distinct(rows: np.ndarray, below: float = 0.999) -> None:
    """Every pair of rows points in a different direction."""
    cos = _unit(rows) @ _unit(rows).T
    off = cos[~np.eye(len(rows), dtype=bool)]
    assert off.max() < below, cos


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: BUILDERS[kind](tmp_path_factory.mktemp(kind)) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_builds_are_byte_identical(kind: str, paths: dict[str, Path], tmp_path: Path) -> None:
    again = BUILDERS[kind](tmp_path / kind)
    names = sorted(p.name for p in paths[kind].iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    # CLIP, SigLIP and CLAP in the hub's layout that transformers 4.x reads too; the Col*
    # processors keep transformers 5's processor_config.json (their prompts live there).
    legacy = kind in ("clip", "siglip", "clap")
    assert ("preprocessor_config.json" in names) == legacy
    assert ("processor_config.json" in names) == (not legacy)
    for name in names:
        assert (paths[kind] / name).read_bytes() == (again / name).read_bytes(), name


def test_default_directory_is_built_once_per_process() -> None:
    first = mm.build_tiny_clip()
    assert mm.build_tiny_clip() == first
    assert (first / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("kind", "model_class", "processor_class"),
    [
        ("clip", "CLIPModel", "CLIPProcessor"),
        ("siglip", "SiglipModel", "SiglipProcessor"),
        ("clap", "ClapModel", "ClapProcessor"),
        ("colpali", "ColPaliForRetrieval", "ColPaliProcessor"),
        ("colqwen2", "ColQwen2ForRetrieval", "ColQwen2Processor"),
    ],
)
def test_directory_loads_offline(
    kind: str, model_class: str, processor_class: str, paths: dict[str, Path]
) -> None:
    import transformers
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(paths[kind])
    assert type(processor).__name__ == processor_class
    if kind in ("colpali", "colqwen2"):  # transformers 5 has no AutoModel mapping for them
        model = getattr(transformers, model_class).from_pretrained(paths[kind])
    else:
        model = transformers.AutoModel.from_pretrained(paths[kind])
    assert type(model).__name__ == model_class
    assert AutoConfig.from_pretrained(paths[kind]).model_type == kind


def test_clip_text_side_keeps_clips_semantics(paths: dict[str, Path]) -> None:
    from transformers import AutoConfig, AutoProcessor

    tokenizer = AutoProcessor.from_pretrained(paths["clip"]).tokenizer
    text_config = AutoConfig.from_pretrained(paths["clip"]).text_config
    ids = tokenizer(TEXTS).input_ids
    assert all(
        row[0] == tokenizer.bos_token_id and row[-1] == tokenizer.eos_token_id for row in ids
    )
    assert tokenizer.convert_ids_to_tokens(ids[0][:2]) == ["<|startoftext|>", "a</w>"]
    assert text_config.eos_token_id == tokenizer.eos_token_id != 2  # eos pooling, not argmax
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    assert text_config.max_position_embeddings == tokenizer.model_max_length == 77
    assert max(max(row) for row in ids) < text_config.vocab_size == len(tokenizer)


def test_clip_references(paths: dict[str, Path]) -> None:
    import torch

    texts = ref.clip_text(paths["clip"], TEXTS)
    images = ref.clip_images(paths["clip"], _images())
    assert texts.shape == (4, mm.CLIP_PROJECTION_DIM) and texts.dtype == np.float32
    assert images.shape == (4, mm.CLIP_PROJECTION_DIM)
    _assert_distinct(texts)
    _assert_distinct(images)
    # get_*_features' pooler_output is the projected vector: the forward's embeds, normalized.
    processor, model = ref._load("clip", str(paths["clip"]))
    inputs = processor(text=TEXTS, images=_images(), padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs)
    np.testing.assert_allclose(_unit(texts), out.text_embeds.numpy(), atol=1e-5)
    np.testing.assert_allclose(_unit(images), out.image_embeds.numpy(), atol=1e-5)
    # Padding to the longest is invisible to eos pooling under the causal mask.
    np.testing.assert_allclose(ref.clip_text(paths["clip"], TEXTS[:1]), texts[:1], atol=1e-5)


def test_siglip_pads_to_64_and_returns_input_ids_only(paths: dict[str, Path]) -> None:
    import torch
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(paths["siglip"])
    inputs = processor(text=TEXTS, padding="max_length", truncation=True, return_tensors="pt")
    assert set(inputs) == {"input_ids"}
    assert inputs["input_ids"].shape == (4, mm.SIGLIP_MAX_LENGTH)
    config = AutoConfig.from_pretrained(paths["siglip"]).text_config
    assert config.max_position_embeddings == mm.SIGLIP_MAX_LENGTH
    assert processor.tokenizer.pad_token_id == processor.tokenizer.eos_token_id == 1
    # Lowercased, punctuation dropped, </s> appended, then pad (= </s>) to 64.
    first = processor.tokenizer("The CAT!").input_ids
    assert first == processor.tokenizer("the cat").input_ids and first[-1] == 1

    texts = ref.siglip_text(paths["siglip"], TEXTS)
    assert texts.shape == (4, mm.HIDDEN)
    _assert_distinct(texts)
    # Padding to the longest text (as Infinity does) gives other vectors.
    _, model = ref._load("siglip", str(paths["siglip"]))
    longest = processor(text=TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        wrong = model.get_text_features(**longest).pooler_output.numpy()
    assert ((_unit(texts) * _unit(wrong)).sum(axis=1) < 0.999).all()
    # So does an attention mask the processor did not return.
    padded = processor(text=TEXTS, padding="max_length", truncation=True, return_tensors="pt")
    mask = (padded["input_ids"] != 1).long()
    with torch.inference_mode():
        masked = model.get_text_features(**padded, attention_mask=mask).pooler_output.numpy()
    assert ((_unit(texts) * _unit(masked)).sum(axis=1) < 0.999).all()


def test_siglip_image_references(paths: dict[str, Path]) -> None:
    images = ref.siglip_images(paths["siglip"], _images())
    assert images.shape == (4, mm.HIDDEN)
    _assert_distinct(images)
    np.testing.assert_array_equal(images, ref.siglip_images(paths["siglip"], _images()))


def test_clap_processor_and_references(paths: dict[str, Path]) -> None:
    from transformers import AutoProcessor

    extractor = AutoProcessor.from_pretrained(paths["clap"]).feature_extractor
    assert extractor.sampling_rate == ms.CLAP_RATE == ref.CLAP_SAMPLING_RATE
    assert (extractor.truncation, extractor.padding) == ("rand_trunc", "repeatpad")
    assert (extractor.feature_size, extractor.hop_length, extractor.nb_max_samples) == (
        64,
        480,
        480_000,
    )
    texts = ref.clap_text(paths["clap"], TEXTS)
    audio = ref.clap_audio(paths["clap"], _clips())
    assert texts.shape == (4, mm.CLAP_PROJECTION_DIM)
    assert audio.shape == (5, mm.CLAP_PROJECTION_DIM)
    _assert_distinct(texts)
    _assert_distinct(audio)
    # Clips under 10 s are deterministic (no random crop), alone or batched.
    np.testing.assert_allclose(ref.clap_audio(paths["clap"], _clips()[1:2]), audio[1:2], atol=1e-5)


def test_clap_audio_from_44k_wav_matches_48k(paths: dict[str, Path]) -> None:
    """A 44.1 kHz WAV decoded and resampled (soxr HQ) embeds like the 48 kHz original."""
    native = ms.chirp(200.0, 4000.0, 3.0, ms.CLAP_RATE)
    at_cd = ms.chirp(200.0, 4000.0, 3.0, ms.CD_RATE)
    decoded = ms.decode_clip(ms.wav_bytes(at_cd, ms.CD_RATE))
    assert len(decoded) == len(native)
    a, b = ref.clap_audio(paths["clap"], [native, decoded])
    assert float(_unit(a) @ _unit(b)) > 0.999


@pytest.mark.parametrize("kind", ["colpali", "colqwen2"])
def test_multi_vector_references(kind: str, paths: dict[str, Path]) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(paths[kind])
    pages = _images()
    docs = getattr(ref, f"{kind}_images")(paths[kind], pages)
    queries = getattr(ref, f"{kind}_queries")(paths[kind], QUERIES)
    dim = mm.COLPALI_DIM if kind == "colpali" else mm.COLQWEN2_DIM
    assert len(docs) == len(pages) and len(queries) == len(QUERIES)
    for page, doc in zip(pages, docs, strict=True):
        ids = processor.process_images([page]).input_ids[0]
        assert doc.shape == (len(ids), dim)
        assert (ids == processor.image_token_id).sum() >= 4
        np.testing.assert_allclose(np.linalg.norm(doc, axis=1), 1.0, atol=1e-5)
    for text, query in zip(QUERIES, queries, strict=True):
        ids = processor.process_queries([text]).input_ids[0].tolist()
        assert query.shape == (len(ids), dim)
        pad = processor.tokenizer.pad_token_id
        assert ids.count(pad) >= 10  # the 10 query-augmentation tokens are kept
    _assert_distinct(np.stack([d.mean(axis=0) for d in docs]))
    _assert_distinct(np.stack([q.mean(axis=0) for q in queries]))
    scores = [[ref.maxsim(q, d) for d in docs] for q in queries]
    assert len({round(s, 4) for row in scores for s in row}) == len(docs) * len(queries)


def test_colpali_page_layout(paths: dict[str, Path]) -> None:
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(paths["colpali"])
    config = AutoConfig.from_pretrained(paths["colpali"])
    assert config.vlm_config.image_token_index == processor.image_token_id
    ids = processor.process_images([_images()[0]]).input_ids[0].tolist()
    n = mm.COLPALI_IMAGE_TOKENS
    assert ids[:n] == [processor.image_token_id] * n
    assert ids[n] == processor.tokenizer.bos_token_id
    assert processor.tokenizer.decode(ids[n + 1 :]) == "Describe the image.\n"
    query = processor.process_queries(["cat"]).input_ids[0].tolist()
    assert processor.tokenizer.decode(query[1:]).startswith("Question: cat<pad>")


def test_colqwen2_tokens_follow_page_size(paths: dict[str, Path]) -> None:
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(paths["colqwen2"])
    config = AutoConfig.from_pretrained(paths["colqwen2"]).vlm_config
    assert config.image_token_id == processor.image_token_id
    counts = []
    for name in ("gradient_square", "shapes_wide", "gradient_photo", "gradient_tiny"):
        inputs = processor.process_images([ms.sample_images()[name]])
        tokens = int((inputs.input_ids[0] == processor.image_token_id).sum())
        assert tokens == int(inputs.image_grid_thw[0].prod()) // 4
        assert 4 <= tokens <= 16
        counts.append(tokens)
    assert len(set(counts)) > 1, counts


def test_maxsim_is_the_raw_sum_of_best_matches() -> None:
    query = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    doc = np.array([[0.5, 0.0], [0.0, 2.0]])
    assert ref.maxsim(query, doc) == pytest.approx(0.5 + 2.0 + 1.6)
    assert ref.maxsim(query[:1], doc) == pytest.approx(0.5)


def test_sample_images_are_deterministic_and_decode() -> None:
    first, second = ms.sample_images(), ms.sample_images()
    assert first.keys() == second.keys()
    for name, image in first.items():
        for fmt in ("PNG", "JPEG"):
            data = ms.encode_image(image, fmt)
            assert data == ms.encode_image(second[name], fmt)
            assert ms.decode_image(data).size == image.size
        uri = ms.image_data_uri(image, "PNG")
        assert uri.startswith("data:image/png;base64,")
    assert first["grey"].mode == "L" and first["rgba"].mode == "RGBA"
    sizes = {image.size for image in first.values()}
    assert {(64, 64), (200, 50), (40, 120), (224, 224)} <= sizes
    uris = ms.benchmark_jpeg_uris(3)
    assert len(set(uris)) == 3 and all(u.startswith("data:image/jpeg;base64,") for u in uris)


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_rotated_jpeg_is_upright_only_with_exif(orientation: int) -> None:
    from PIL import Image

    image = ms.gradient_image(40, 20)
    data = ms.exif_rotated_jpeg(image, orientation)
    upright = np.asarray(ms.decode_image(data), dtype=float)
    assert upright.shape == (20, 40, 3)
    assert np.abs(upright - np.asarray(image, dtype=float)).mean() < 3
    with Image.open(io.BytesIO(data)) as raw:
        assert raw.size == ((40, 20) if orientation == 3 else (20, 40))


def test_broken_images_fail_as_described() -> None:
    from PIL import Image

    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(ms.bomb_png()))
    with Image.open(io.BytesIO(ms.truncated_jpeg())) as image, pytest.raises(OSError):
        image.load()
    with pytest.raises(Image.UnidentifiedImageError):
        Image.open(io.BytesIO(ms.text_as_image()))


def test_sample_audio() -> None:
    clips = ms.sample_clips()
    assert all(c.dtype == np.float32 and 0 < len(c) <= 480_000 for c in clips.values())
    wav = ms.wav_bytes(clips["chirp"], ms.CLAP_RATE)
    assert wav == ms.wav_bytes(ms.sample_clips()["chirp"], ms.CLAP_RATE)
    assert ms.audio_data_uri(clips["chirp"], ms.CLAP_RATE).startswith("data:audio/wav;base64,")
    np.testing.assert_allclose(ms.decode_clip(wav), clips["chirp"], atol=1 / 16384)
    at_cd = ms.sample_clips(ms.CD_RATE)["chirp"]
    assert len(at_cd) == 3 * ms.CD_RATE
    resampled = ms.decode_clip(ms.wav_bytes(at_cd, ms.CD_RATE))
    np.testing.assert_allclose(resampled[1000:-1000], clips["chirp"][1000:-1000], atol=1e-3)
    stereo = ms.decode_clip(ms.wav_bytes(ms.stereo_clip(), ms.CLAP_RATE))
    expected = ms.stereo_clip().mean(axis=1)
    np.testing.assert_allclose(stereo, expected, atol=1e-4)


@pytest.mark.slow
def test_full_size_benchmark_models(tmp_path: Path) -> None:
    """The ViT-B/32-sized CLIP and the HTSAT-base CLAP build, load and run."""
    import torch
    from transformers import AutoModel, AutoProcessor

    for build, params in ((mm.build_clip_vit_b32, 151.3e6), (mm.build_clap_base, 153.5e6)):
        path = build(tmp_path / build.__name__)
        assert (path / "preprocessor_config.json").is_file()
        model = AutoModel.from_pretrained(path).eval()
        processor = AutoProcessor.from_pretrained(path)
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(params, rel=1e-3)
        with torch.inference_mode():
            text = model.get_text_features(
                **processor(text=TEXTS[:2], padding=True, return_tensors="pt")
            )
            if build is mm.build_clip_vit_b32:
                inputs = processor(images=_images()[:2], return_tensors="pt")
                assert inputs.pixel_values.shape == (2, 3, 224, 224)
                other = model.get_image_features(**inputs)
            else:
                inputs = processor(
                    audio=_clips()[:2], sampling_rate=ms.CLAP_RATE, return_tensors="pt"
                )
                other = model.get_audio_features(**inputs)
        assert text.pooler_output.shape == other.pooler_output.shape == (2, 512)
        del model
