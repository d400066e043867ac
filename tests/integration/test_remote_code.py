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


# ------------------------------------------------- task adapters (jina-embeddings-v3)


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.remote_code import build_tiny_lora_embedder

    return build_tiny_lora_embedder(tmp_path_factory.mktemp("lora") / "jina-like")


def _lora_reference(path: Path, texts: list[str], task: str | None) -> np.ndarray:
    """jina-embeddings-v3's documented encode, computed here from the same files (its
    custom_st module, which sentence-transformers would import, is the model's code not
    shipped with the tiny copy): the task's instruction before each text, ``adapter_mask``
    of the task's id for every row, mean pooling, normalised; no task: the base weights."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from tests.fixtures.remote_code import LORA_INSTRUCTIONS, LORA_TASKS

    model = AutoModel.from_pretrained(str(path), trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    if task is not None:
        texts = [LORA_INSTRUCTIONS[task] + t for t in texts]
    batch = tok(texts, padding=True, truncation=True, return_tensors="pt")
    mask = None
    if task is not None:
        mask = torch.full((len(texts),), LORA_TASKS.index(task), dtype=torch.int32)
    with torch.inference_mode():
        states = model(**batch, adapter_mask=mask).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).float()
    pooled = ((states * weights).sum(1) / weights.sum(1)).numpy()
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_task_adapters_follow_the_prompt_name_and_input_type(lora: Path) -> None:
    """A task named by TEI's prompt_name (or Cohere's input_type, mapped to jina's task
    names) runs that task's LoRA adapter and instruction, as jina's encode(task=...) does;
    no task runs the base weights. The adapters are far apart (the test can tell them)."""
    args = ["--model-id", str(lora), "--served-model-name", "jina", "--trust-remote-code"]
    queries, docs = TEXTS[:4], TEXTS[4:8]
    with start_server(args) as server, server.client() as client:
        got = {
            task: np.array(
                client.post(
                    "/embed", json={"model": "jina", "inputs": queries, "prompt_name": task}
                ).json()
            )
            for task in ("retrieval.query", "separation")
        }
        body = {"model": "jina", "input": docs, "input_type": "search_document"}
        got["retrieval.passage"] = np.array(
            [r["embedding"] for r in client.post("/v1/embeddings", json=body).json()["data"]]
        )
        plain = client.post("/v1/embeddings", json={"model": "jina", "input": queries}).json()
        got[None] = np.array([r["embedding"] for r in plain["data"]])
    for task, rows in got.items():
        texts = docs if task == "retrieval.passage" else queries
        assert _cosines(rows, _lora_reference(lora, texts, task)).min() >= 0.9999, task
    base = _lora_reference(lora, queries, None)
    assert _cosines(_lora_reference(lora, queries, "separation"), base).max() < 0.99


def test_task_adapters_run_on_torch_only(lora: Path) -> None:
    """An export would drop the adapters its code selects: onnx and ct2 refuse at start."""
    for backend in ("onnx", "ct2"):
        args = ["--model-id", str(lora), "--trust-remote-code", "--backend", backend]
        errors = refused_start(args)
        assert len(errors) == 1 and "LoRA task adapters" in errors[0], errors
