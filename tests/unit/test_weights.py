"""Where Ember reads weights itself (SPLADE's MLM head, Dense projections), it loads what
transformers loads from the same files: legacy ``LayerNorm.gamma``/``beta`` names, a
``pytorch_model.bin`` only, and checkpoints sharded by a safetensors or a torch index.

Each form is written here from one tiny SPLADE checkpoint (sentence-transformers' own save),
then loaded by transformers and by Ember; both must give the original tensors exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.heads.build import load_mlm_head
from ember.models.spec import ModelSpec
from ember.models.weights import checkpoint_files, read_checkpoint
from tests.fixtures import references as ref
from tests.fixtures.retrieval_models import build_tiny_splade

FORMS = ("legacy-names", "bin-only", "sharded-safetensors", "sharded-bin-legacy-names")
WEIGHTS = ("model.safetensors", "pytorch_model.bin")
HEAD = "cls.predictions."


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_splade(tmp_path_factory.mktemp("splade") / "model")


def _legacy(state: dict) -> dict:
    """Names as TF-era BERT checkpoints stored them: LayerNorm.gamma / LayerNorm.beta."""
    renames = (("LayerNorm.weight", "LayerNorm.gamma"), ("LayerNorm.bias", "LayerNorm.beta"))
    renamed = {}
    for name, tensor in state.items():
        for new, old in renames:
            name = name.replace(new, old)
        renamed[name] = tensor
    return renamed


def _write(form: str, src: Path, dst: Path) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*WEIGHTS))
    state = load_file(str(src / "model.safetensors"))
    if "legacy" in form:
        state = _legacy(state)
        assert any(k.endswith("LayerNorm.gamma") for k in state)
    if form == "legacy-names":
        save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    elif form == "bin-only":
        torch.save(state, dst / "pytorch_model.bin")
    else:  # two shards and the index transformers writes beside them
        safetensors = form == "sharded-safetensors"
        suffix, index = (".safetensors", "model.safetensors.index.json")
        if not safetensors:
            suffix, index = (".bin", "pytorch_model.bin.index.json")
        stem = "model" if safetensors else "pytorch_model"
        names = sorted(state)
        halves = (names[: len(names) // 2], names[len(names) // 2 :])
        weight_map = {}
        for n, half in enumerate(halves, 1):
            shard = f"{stem}-{n:05d}-of-00002{suffix}"
            part = {k: state[k] for k in half}
            if safetensors:
                save_file(part, str(dst / shard), metadata={"format": "pt"})
            else:
                torch.save(part, dst / shard)
            weight_map.update(dict.fromkeys(half, shard))
        total = sum(v.numel() * v.element_size() for v in state.values())
        meta = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (dst / index).write_text(json.dumps(meta))
    return dst


@pytest.mark.parametrize("form", FORMS)
def test_ember_reads_what_transformers_loads(splade: Path, tmp_path: Path, form: str) -> None:
    from transformers import AutoModelForMaskedLM

    original = AutoModelForMaskedLM.from_pretrained(str(splade)).state_dict()
    directory = _write(form, splade, tmp_path / form)
    theirs = AutoModelForMaskedLM.from_pretrained(str(directory)).state_dict()
    for name, tensor in original.items():  # the form is a checkpoint transformers loads
        assert np.array_equal(theirs[name].numpy(), tensor.numpy()), name
    ours = read_checkpoint(directory)
    assert any(k.startswith(HEAD) and k.endswith("LayerNorm.weight") for k in ours)
    assert set(ours) <= set(theirs), sorted(set(ours) - set(theirs))
    for name, array in ours.items():
        assert np.array_equal(array, theirs[name].numpy()), name
    head = load_mlm_head(resolve_model(ModelSpec(str(directory), backend="torch")))
    transform = HEAD + "transform."
    pairs = [
        (head.dense_w, transform + "dense.weight"),
        (head.dense_b, transform + "dense.bias"),
        (head.norm_w, transform + "LayerNorm.weight"),
        (head.norm_b, transform + "LayerNorm.bias"),
        (head.decoder_w, HEAD + "decoder.weight"),  # tied: the word embeddings
        (head.decoder_b, HEAD + "bias"),
    ]
    for array, name in pairs:
        assert np.array_equal(array, theirs[name].numpy()), name


def test_a_legacy_named_splade_serves_as_sentence_transformers_encodes(
    splade: Path, tmp_path: Path
) -> None:
    """The reported failure: "none of (...LayerNorm.weight,) in the weights (not an MLM
    model?)" for a checkpoint transformers (and so SparseEncoder) loads."""
    from ember.engine import SyncEngineArray

    directory = _write("legacy-names", splade, tmp_path / "legacy")
    texts = ["what is a sparse retriever?", "SPLADE expands terms through its MLM head."]
    want = ref.splade_encode(directory, texts)
    with SyncEngineArray(model_id=str(directory), backend="torch", device="cpu") as ember:
        vectors = ember.embed(texts)
    got = np.zeros_like(want)
    for row, vector in zip(got, vectors, strict=True):
        row[vector.indices] = vector.values
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert (want > 0).sum() > 0


def test_a_checkpoint_ember_cannot_use_is_refused_by_name(splade: Path, tmp_path: Path) -> None:
    directory = _write("sharded-safetensors", splade, tmp_path / "sharded")
    next(directory.glob("model-00002-of-00002.safetensors")).unlink()
    with pytest.raises(ConfigError, match="names shards that are not there: model-00002"):
        checkpoint_files(directory)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no weights transformers would load"):
        checkpoint_files(empty)
