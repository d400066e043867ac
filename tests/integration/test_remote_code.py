"""A model that ships its own code (nomic-embed-text-v1.5's layout): refused without
``--trust-remote-code``, served through its own classes with it, and equal to
sentence-transformers loading the same files with ``trust_remote_code=True``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.remote_code import build_tiny_remote_code_embedder
from tests.support import refused_start, start_server
from tests.texts import mixed_texts

TEXTS = mixed_texts(12)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_remote_code_embedder(tmp_path_factory.mktemp("remote") / "nomic-like")


def _reference(path: Path, texts: list[str], prompt: str | None = None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), trust_remote_code=True, device="cpu")
    return model.encode(texts, prompt_name=prompt, convert_to_numpy=True)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


@pytest.mark.parametrize("backend", ["auto", "onnx", "ct2"])
def test_without_the_flag_start_up_refuses_and_names_it(remote: Path, backend: str) -> None:
    """Before any backend loads (none could run the code without it): one line, exit 2."""
    errors = refused_start(["--model-id", str(remote), "--backend", backend])
    assert len(errors) == 1 and "--trust-remote-code" in errors[0], errors
    assert "modeling_tiny_remote.TinyRemoteModel" in errors[0]


@pytest.mark.parametrize("backend", ["auto", "onnx"])
def test_with_the_flag_its_own_classes_serve_it(remote: Path, backend: str) -> None:
    """``--backend auto`` picks torch for remote code; onnx exports the model's own
    classes. The vectors are the model's own code's: a plain BERT on the same weights (no
    tanh) would be far off."""
    args = ["--model-id", str(remote), "--served-model-name", "nomic", "--trust-remote-code"]
    args += ["--backend", backend]
    with start_server(args) as server, server.client() as client:
        rows = client.post("/v1/embeddings", json={"model": "nomic", "input": TEXTS}).json()
        queries = client.post(
            "/embed", json={"model": "nomic", "inputs": TEXTS[:4], "prompt_name": "query"}
        ).json()
        info = {m["id"]: m for m in client.get("/v1/models").json()["data"]}["nomic"]
    got = np.array([r["embedding"] for r in rows["data"]])
    assert info["backend"] == ("torch" if backend == "auto" else backend), info
    assert _cosines(got, _reference(remote, TEXTS)).min() >= 0.9999
    want = _reference(remote, TEXTS[:4], prompt="query")
    assert _cosines(np.array(queries), want).min() >= 0.9999
    plain = _plain_bert(remote, TEXTS)
    assert _cosines(got, plain).min() < 0.99  # the test can tell the two loaders apart


def _plain_bert(path: Path, texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalised states of transformers' built-in BertModel on the same
    weights: what a loader that ignored the model's code would serve."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    config = BertConfig.from_pretrained(str(path))
    model = BertModel.from_pretrained(str(path), config=config, add_pooling_layer=False).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        states = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return ((states * mask).sum(1) / mask.sum(1)).numpy()


def test_ct2_refuses_remote_code_at_start_with_what_to_use(remote: Path) -> None:
    errors = refused_start(["--model-id", str(remote), "--backend", "ct2", "--trust-remote-code"])
    assert len(errors) == 1 and "use --backend torch or onnx" in errors[0], errors
