"""Classifiers scored by their config's ``problem_type``, on every backend that serves them.

A multi-label classifier (as SamLowe/roberta-base-go_emotions: one sigmoid per label) and a
three-output regression (raw values), saved with transformers' ``save_pretrained``, served
by a real ``ember serve`` on torch, onnx and ct2; ``/classify``, ``/predict`` and TEI's
``POST /`` (both bodies) must each give what transformers' ``pipeline("text-classification",
top_k=None)`` gives on the same files: the same labels in the same order, scores within 1e-4.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.tiny_models import (
    build_tiny_multilabel_classifier,
    build_tiny_regression_classifier,
)
from tests.support import ServerProcess, start_server
from tests.texts import mixed_texts

TEXTS = mixed_texts(30)  # the 25 fixed texts (long, blank, unicode) and 5 drawn
ATOL = 1e-4
NAMES = ("multilabel", "regression")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("problem-types")
    return {
        "multilabel": build_tiny_multilabel_classifier(root / "multilabel"),
        "regression": build_tiny_regression_classifier(root / "regression"),
    }


@pytest.fixture(scope="module")
def references(paths: dict[str, Path]) -> dict[str, list[list[dict]]]:
    from transformers import pipeline

    answers = {}
    for name, path in paths.items():
        pipe = pipeline("text-classification", model=str(path), top_k=None, device="cpu")
        # RoBERTa's positions end 2 short of max_position_embeddings (130): 128, as Ember reads
        answers[name] = pipe(TEXTS, truncation=True, max_length=128)
    return answers


@pytest.fixture(scope="module", params=["torch", "onnx", "ct2"])
def server(
    request: pytest.FixtureRequest,
    paths: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    cache = tmp_path_factory.mktemp(f"cache-{request.param}")
    with start_server(
        [
            "--model-id",
            ";".join(str(paths[n]) for n in NAMES),
            "--served-model-name",
            ";".join(NAMES),
            "--backend",
            request.param,
            "--device",
            "cpu",
            "--cache-dir",
            str(cache),
        ]
    ) as proc:
        yield proc


def _assert_same(got: list[list[dict]], want: list[list[dict]]) -> float:
    """Same labels in the same order per text; returns the largest score difference."""
    assert len(got) == len(want)
    worst = 0.0
    for ours, theirs in zip(got, want, strict=True):
        assert [g["label"] for g in ours] == [w["label"] for w in theirs]
        diff = np.abs(np.array([g["score"] for g in ours]) - [w["score"] for w in theirs])
        worst = max(worst, float(diff.max()))
    assert worst <= ATOL, worst
    return worst


@pytest.mark.parametrize("name", NAMES)
def test_every_route_scores_as_the_pipeline(
    server: ServerProcess, references: dict, name: str
) -> None:
    want = references[name]
    with server.client() as http:
        classify = http.post("/classify", json={"model": name, "input": TEXTS}).json()["data"]
        predict = http.post("/predict", json={"model": name, "inputs": TEXTS}).json()
        root = http.post("/", json={"model": name, "inputs": TEXTS}).json()
        inference_api = http.post("/", json={"model": name, "inputs": TEXTS, "parameters": {}})
        info = http.get("/info").json()  # the first model's labels, in id order
    for got in (classify, predict, root, inference_api.json()):
        _assert_same(got, want)
    assert list(info["model_type"]["classifier"]["id2label"].values()) == [
        "admiration",
        "amusement",
        "anger",
        "annoyance",
        "approval",
        "caring",
    ]


def test_multilabel_scores_are_per_label(server: ServerProcess, references: dict) -> None:
    """The failure this guards against: a softmax over labels that are not exclusive."""
    with server.client() as http:
        rows = http.post("/classify", json={"model": "multilabel", "input": TEXTS}).json()["data"]
        raw = http.post(
            "/predict", json={"model": "multilabel", "inputs": TEXTS, "raw_scores": True}
        ).json()
        softmax = http.post(
            "/",
            json={
                "model": "multilabel",
                "inputs": TEXTS,
                "parameters": {"function_to_apply": "softmax"},
            },
        ).json()
    sums = [sum(e["score"] for e in row) for row in rows]
    assert max(abs(s - 1.0) for s in sums) > 0.1  # not a distribution over the labels
    for row, logits, soft in zip(rows, raw, softmax, strict=True):
        z = np.array([e["score"] for e in logits])
        np.testing.assert_allclose([e["score"] for e in row], 1 / (1 + np.exp(-z)), atol=1e-6)
        np.testing.assert_allclose(
            [e["score"] for e in soft], np.exp(z) / np.exp(z).sum(), atol=1e-6
        )
