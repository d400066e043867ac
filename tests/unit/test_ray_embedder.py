"""``ember.ray.Embedder`` called as Ray Data calls it, without a cluster: a column of a
batch (pyarrow or NumPy) embedded to the engine's own vectors, refused rows null with
their reason, the other columns passed through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from ember.ray import Embedder  # noqa: E402

TEXTS = ["a short one", "long " * 300, "retrieval for search", None]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_models import build_tiny_embedder

    return build_tiny_embedder(tmp_path_factory.mktemp("ray-embedder") / "tiny")


@pytest.fixture(scope="module")
def embedder(tiny: Path) -> Embedder:
    return Embedder(str(tiny), column="body", truncate=False, backend="torch", device="cpu")


def _want(tiny: Path) -> np.ndarray:
    from ember.engine import SyncEngineArray

    with SyncEngineArray(model_id=str(tiny), backend="torch", device="cpu") as ref:
        return ref.embed([TEXTS[0], TEXTS[2]])


def test_a_numpy_batch(embedder: Embedder, tiny: Path) -> None:
    batch = {"body": np.array(TEXTS, dtype=object), "key": np.arange(4)}
    out = embedder(batch)
    assert out["key"].tolist() == [0, 1, 2, 3]
    vectors = out["embedding"]
    assert vectors.shape == (4, 32) and vectors.dtype == np.float32
    assert np.isnan(vectors[1]).all() and np.isnan(vectors[3]).all()
    assert np.abs(vectors[[0, 2]] - _want(tiny)).max() < 1e-5
    errors = out["error"].tolist()
    assert errors[0] is None and errors[2] is None
    assert "more than this model's maximum of 128" in errors[1]
    assert errors[3] == "no text in the row"


def test_a_pyarrow_batch_keeps_the_columns_asked_for(embedder: Embedder, tiny: Path) -> None:
    batch = pa.table({"body": TEXTS, "key": [10, 11, 12, 13]})
    out = embedder(batch)
    assert out.column_names == ["body", "key", "embedding", "error"]
    column = out.column("embedding")
    assert column.null_count == 2 and column.type == pa.list_(pa.float32(), 32)
    got = np.asarray([column[i].as_py() for i in (0, 2)], np.float32)
    assert np.abs(got - _want(tiny)).max() < 1e-5
    assert out.column("error").null_count == 2

    embedder.keep_columns = ["key"]
    try:
        assert embedder(batch).column_names == ["key", "embedding", "error"]
    finally:
        embedder.keep_columns = None


def test_embed_ray_refuses_bad_options_in_one_line_before_any_worker(
    tiny: Path, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from tests.support import REPO, child_env

    corpus = tmp_path / "c.txt"
    corpus.write_text("hello\n")
    for flag, fragment in (
        ("--dimensions=999", "dimensions must be between 1 and 32 for this model, got 999"),
        ("--prompt-name=query", "prompt_name 'query' is not one of this model's prompts"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "ember", "embed", str(corpus), "--output",
             str(tmp_path / "o"), "--model-id", str(tiny), "--ray", flag],
            cwd=REPO, env=child_env(drop_prefixes=("EMBER_", "RAY_ADDRESS")),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert fragment in done.stderr.strip().splitlines()[-1]
