"""The typed outputs (``ember.outputs``): each type finishes itself, and no module outside
it compares an output kind's name (it asks the type instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from ember.errors import BadRequest
from ember.outputs import (
    OUTPUT_TYPES,
    DenseVectors,
    Labels,
    Logits,
    MultiVectors,
    SparseVector,
    SparseVectors,
    embeds,
    to_base64,
)

CORE = Path(__file__).resolve().parents[2] / "core" / "ember"
KINDS = {"dense", "sparse", "multi", "logits"}


def _kind_literals(node: ast.AST) -> bool:
    """Whether ``node`` is a kind's name, or a tuple, list or set holding one."""
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_kind_literals(item) for item in node.elts)
    return False


def test_no_output_kind_is_compared_outside_the_output_types() -> None:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        if path == CORE / "outputs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(
                _kind_literals(side) for side in (node.left, *node.comparators)
            ):
                found.append(f"{path.relative_to(CORE)}:{node.lineno}")
    assert not found, f"output kinds compared by name (ask ember.outputs' types): {found}"


def test_every_output_kind_has_a_type_that_collects_its_rows() -> None:
    assert set(OUTPUT_TYPES) == KINDS
    assert [k for k in OUTPUT_TYPES if embeds(k)] == ["dense", "multi", "sparse"]
    assert not embeds(None)


def test_dense_vectors_cut_then_normalise() -> None:
    rows = [np.array([3.0, 4.0, 12.0], np.float32), np.array([0.0, 2.0, 1.0], np.float32)]
    done = DenseVectors.from_rows(rows).finished(normalize=True, dimensions=2, hidden=3)
    assert done.vectors.dtype == np.float32 and done.vectors.shape == (2, 2)
    assert np.allclose(done.vectors, [[0.6, 0.8], [0.0, 1.0]])
    raw = DenseVectors.from_rows(rows).finished(normalize=False, dimensions=None, hidden=3)
    assert np.array_equal(raw.vectors, np.stack(rows)) and raw.vectors.flags["C_CONTIGUOUS"]


@pytest.mark.parametrize("dimensions", [0, 4])
def test_dimensions_out_of_range_are_refused(dimensions: int) -> None:
    with pytest.raises(BadRequest, match="between 1 and 3") as refused:
        DenseVectors.check_dimensions(dimensions, 3, "m")
    assert refused.value.param == "dimensions"


@pytest.mark.parametrize("kind", [MultiVectors, SparseVectors])
def test_only_dense_vectors_take_dimensions(kind: type) -> None:
    with pytest.raises(BadRequest, match="applies to dense embeddings"):
        kind.check_dimensions(2, 3, "m")


def test_cosine_of_pairs_of_rows() -> None:
    vectors = DenseVectors(np.array([[1, 0], [0, 2], [3, 3]], np.float32))
    scores = vectors.cosine([0, 0, 1], [1, 2, 2]).values
    assert scores.dtype == np.float64
    assert np.allclose(scores, [0.0, 2**-0.5, 2**-0.5])


def test_maxsim_is_the_raw_sum_of_each_query_vectors_best() -> None:
    query = np.array([[1, 0], [0, 1]], np.float32)
    docs = [np.array([[0.5, 0.5], [1, 0]], np.float32), np.zeros((0, 2), np.float32)]
    assert np.allclose(MultiVectors([query, *docs]).maxsim().values, [1.5, 0.0])


def test_logits_finish_into_scores_and_labels() -> None:
    logits = Logits.from_rows([np.array([0.0]), np.array([2.0])])
    assert np.allclose(logits.scores(raw=False).values, [0.5, 1 / (1 + np.exp(-2.0))])
    assert np.array_equal(logits.scores(raw=True).values, [0.0, 2.0])
    labels = Logits(np.array([[1.0, 3.0]])).labels({0: "a", 1: "b"}, raw=True, activation="none")
    assert [item["label"] for item in labels.rows[0]] == ["b", "a"]
    applied = labels.applied("softmax", top_k=1).rows
    assert applied[0][0]["label"] == "b" and applied[0][0]["score"] == pytest.approx(
        np.exp(3) / (np.exp(1) + np.exp(3))
    )
    assert labels.applied(None).rows == labels.rows


def test_base64_is_little_endian_float32_of_each_row() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3)
    import base64

    encoded = DenseVectors(vectors).base64_rows()
    assert [np.frombuffer(base64.b64decode(s), "<f4").tolist() for s in encoded] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert MultiVectors([vectors]).base64_rows() == [to_base64(vectors)]
    assert not SparseVectors.base64 and DenseVectors.base64 and MultiVectors.base64


def test_sparse_vectors_keep_their_rows() -> None:
    vector = SparseVector.from_dense(np.array([0, 0.5, 0, 2], np.float32))
    assert vector.indices.tolist() == [1, 3] and vector.as_dict()["values"].tolist() == [0.5, 2]
    assert SparseVectors.from_rows([vector]).payload == [vector]
    assert Labels.from_rows([[{"label": "a", "score": 1.0}]]).payload[0][0]["label"] == "a"
