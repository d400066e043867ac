"""The retrieval fixtures and their references: layouts as the libraries write them, and
each hand-written reference equal to the library it describes.

ColBERT's hand reference is checked against sentence-transformers 6's MultiVectorEncoder
(which loads PyLate checkpoints) and, where installed and compatible, real PyLate; SPLADE's
formula against SparseEncoder; BGE-M3's dense output against SentenceTransformer and, where
it imports, real FlagEmbedding. Tolerance: 1e-5 absolute on unit vectors, 1e-4 relative
on SPLADE weights (measured agreement is ~2e-7 throughout).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import references as ref
from tests.fixtures.retrieval_models import (
    BGE_M3_IDS,
    COLBERT_DIM,
    COLBERT_DOCUMENT_LENGTH,
    COLBERT_IDS,
    COLBERT_QUERY_LENGTH,
    HIDDEN,
    build_tiny_bge_m3,
    build_tiny_colbert,
    build_tiny_splade,
)
from tests.texts import FIXED

# Short, punctuated, unicode, emoji (an <unk> for the XLM-R tokenizer), empty after strip,
# and one far past every max length.
TEXTS = [FIXED[i] for i in (1, 2, 3, 6, 12, 15, 19)]
LONG = FIXED[19]


@pytest.fixture(scope="module")
def colbert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_colbert(tmp_path_factory.mktemp("colbert"))


@pytest.fixture(scope="module")
def colbert_out(colbert: Path) -> dict[str, list[np.ndarray]]:
    return {
        "q": ref.colbert_encode(colbert, TEXTS, is_query=True),
        "d": ref.colbert_encode(colbert, TEXTS, is_query=False),
    }


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_splade(tmp_path_factory.mktemp("splade"))


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bge_m3(tmp_path_factory.mktemp("bge-m3"))


@pytest.fixture(scope="module")
def bge_m3_out(bge_m3: Path) -> dict:
    return ref.bge_m3_encode(bge_m3, TEXTS)


def _assert_same_vectors(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert [x.shape for x in a] == [x.shape for x in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


# ------------------------------------------------------------------------------- ColBERT


def test_colbert_layout_is_pylates(colbert: Path) -> None:
    modules = json.loads((colbert / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        "sentence_transformers.models.Transformer",
        "pylate.models.Dense.Dense",
    ]
    cfg = json.loads((colbert / "config_sentence_transformers.json").read_text())
    assert cfg["model_type"] == "ColBERT" and cfg["similarity_fn_name"] == "MaxSim"
    assert (cfg["query_length"], cfg["document_length"]) == (16, 64)
    assert cfg["query_prefix"] == "[Q] " and cfg["document_prefix"] == "[D] "
    assert cfg["do_query_expansion"] is True and cfg["attend_to_expansion_tokens"] is False
    from safetensors import safe_open

    with safe_open(str(colbert / "1_Dense" / "model.safetensors"), "np") as f:
        assert list(f.keys()) == ["linear.weight"]
        assert f.get_tensor("linear.weight").shape == (COLBERT_DIM, HIDDEN)
    tok = json.loads((colbert / "tokenizer_config.json").read_text())
    assert tok["pad_token"] == "[MASK]"


def test_colbert_token_ids(colbert: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(colbert))
    for token in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"):
        assert tokenizer.convert_tokens_to_ids(token) == COLBERT_IDS[token]
    # The added vocabulary entries are the prefixes with their trailing space.
    assert tokenizer.convert_tokens_to_ids("[Q] ") == COLBERT_IDS["[Q]"]
    assert tokenizer.convert_tokens_to_ids("[D] ") == COLBERT_IDS["[D]"]
    assert tokenizer.pad_token_id == COLBERT_IDS["[MASK]"]
    assert COLBERT_IDS["[UNK]"] not in ref.colbert_skiplist_ids(colbert)


def test_colbert_tokenisation(colbert: Path) -> None:
    ids, mask = ref.colbert_tokenize(colbert, "Hello, world!", is_query=True)
    cls, q, sep, msk = (COLBERT_IDS[t] for t in ("[CLS]", "[Q]", "[SEP]", "[MASK]"))
    assert len(ids) == COLBERT_QUERY_LENGTH
    assert ids[:2] == [cls, q] and ids[6] == sep and set(ids[7:]) == {msk}
    assert mask == [1] * 7 + [0] * 9  # expansion tokens not attended (attend_to_expansion_tokens)
    ids, mask = ref.colbert_tokenize(colbert, "Hello, world!", is_query=False)
    assert ids[:2] == [cls, COLBERT_IDS["[D]"]] and ids[-1] == sep and mask == [1] * 7
    ids, _ = ref.colbert_tokenize(colbert, LONG, is_query=False)
    assert len(ids) == COLBERT_DOCUMENT_LENGTH and ids[-1] == sep


def test_colbert_outputs(colbert: Path, colbert_out: dict) -> None:
    assert all(q.shape == (COLBERT_QUERY_LENGTH, COLBERT_DIM) for q in colbert_out["q"])
    # "Hello, world!" -> [CLS] [D] hello , world ! [SEP]: the skiplist drops ',' and '!'.
    assert colbert_out["d"][0].shape == (5, COLBERT_DIM)
    assert colbert_out["d"][3].shape == (3, COLBERT_DIM)  # whitespace only: [CLS] [D] [SEP]
    assert colbert_out["d"][6].shape[0] < COLBERT_DOCUMENT_LENGTH  # truncated, then '.' dropped
    for v in colbert_out["q"] + colbert_out["d"]:
        np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_colbert_attending_to_expansion_changes_queries_only(
    tmp_path: Path, colbert_out: dict
) -> None:
    other = build_tiny_colbert(tmp_path / "attend", attend_to_expansion_tokens=True)
    q = ref.colbert_encode(other, TEXTS[:2], is_query=True)
    d = ref.colbert_encode(other, TEXTS[:2], is_query=False)
    assert np.abs(q[0] - colbert_out["q"][0]).max() > 1e-2
    _assert_same_vectors(d, colbert_out["d"][:2])


def test_colbert_matches_sentence_transformers_multi_vector_encoder(
    colbert: Path, colbert_out: dict
) -> None:
    st = pytest.importorskip("sentence_transformers")
    if not hasattr(st, "MultiVectorEncoder"):
        pytest.skip("sentence-transformers < 6 has no MultiVectorEncoder")
    _assert_same_vectors(ref.st_multi_vector_encode(colbert, TEXTS, True), colbert_out["q"])
    _assert_same_vectors(ref.st_multi_vector_encode(colbert, TEXTS, False), colbert_out["d"])


def _pylate_or_skip() -> None:
    pytest.importorskip("pylate", exc_type=ImportError)
    from importlib.metadata import requires, version

    for req in requires("pylate") or []:
        name, _, pin = req.partition("==")
        if name.strip() == "sentence-transformers" and pin.split(";")[0].strip() != version(
            "sentence-transformers"
        ):
            pytest.skip(f"pylate needs sentence-transformers=={pin}")


def test_colbert_matches_real_pylate(colbert: Path, colbert_out: dict) -> None:
    _pylate_or_skip()
    _assert_same_vectors(ref.pylate_encode(colbert, TEXTS, True), colbert_out["q"])
    _assert_same_vectors(ref.pylate_encode(colbert, TEXTS, False), colbert_out["d"])
    np.testing.assert_allclose(
        ref.pylate_rerank_scores(colbert_out["q"], colbert_out["d"]),
        ref.maxsim_matrix(colbert_out["q"], colbert_out["d"]),
        rtol=1e-5,
    )


def test_maxsim_is_a_raw_sum() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    d = np.array([[1.0, 0.0], [0.0, -1.0]])
    assert ref.maxsim(q, d) == pytest.approx(1.0 + 0.0 + 0.6)
    assert ref.bge_m3_colbert_score(q, d) == pytest.approx(1.6 / 3)


# ------------------------------------------------------------------------------- SPLADE


def test_splade_layout(splade: Path) -> None:
    modules = json.loads((splade / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_SpladePooling"]
    assert json.loads((splade / "1_SpladePooling" / "config.json").read_text())[
        "pooling_strategy"
    ] == ("max")
    assert json.loads((splade / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_splade_formula_matches_sparse_encoder(splade: Path) -> None:
    lib = ref.splade_encode(splade, TEXTS)
    manual = ref.splade_manual(splade, TEXTS)
    assert lib.shape == (len(TEXTS), 30522)
    assert (lib >= 0).all() and 50 < (lib > 0).sum(axis=1).min() < 5000
    np.testing.assert_allclose(lib, manual, rtol=1e-4, atol=1e-4 * np.abs(manual).max())


def test_splade_st5_layout_encodes_alike(tmp_path: Path, splade: Path) -> None:
    st5 = build_tiny_splade(tmp_path / "st5", st5_layout=True)
    assert "sparse_encoder.models.MLMTransformer" in (st5 / "modules.json").read_text()
    np.testing.assert_array_equal(ref.splade_encode(st5, TEXTS), ref.splade_encode(splade, TEXTS))


# ------------------------------------------------------------------------------- BGE-M3


def test_bge_m3_layout(bge_m3: Path) -> None:
    import torch

    colbert = torch.load(bge_m3 / "colbert_linear.pt", weights_only=True)
    sparse = torch.load(bge_m3 / "sparse_linear.pt", weights_only=True)
    assert {k: tuple(v.shape) for k, v in colbert.items()} == {
        "weight": (HIDDEN, HIDDEN),
        "bias": (HIDDEN,),
    }
    assert {k: tuple(v.shape) for k, v in sparse.items()} == {"weight": (1, HIDDEN), "bias": (1,)}
    assert (bge_m3 / "pytorch_model.bin").exists() and not (bge_m3 / "2_Normalize").exists()
    config = json.loads((bge_m3 / "config.json").read_text())
    assert config["pad_token_id"] == 1 and config["max_position_embeddings"] == 8194


def test_bge_m3_tokenizer_is_xlmr_shaped(bge_m3: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(bge_m3))
    raw = Tokenizer.from_file(str(bge_m3 / "tokenizer.json"))
    for token, idx in BGE_M3_IDS.items():
        assert hf.convert_tokens_to_ids(token) == idx
    for text in FIXED:
        assert hf(text)["input_ids"] == raw.encode(text).ids
    enc = hf("Hello, world!")
    assert enc["input_ids"][0] == 0 and enc["input_ids"][-1] == 2
    assert "token_type_ids" not in enc


def test_bge_m3_outputs(bge_m3: Path, bge_m3_out: dict) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bge_m3))
    dense = bge_m3_out["dense_vecs"]
    assert dense.shape == (len(TEXTS), HIDDEN)
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    for text, vecs, lw in zip(
        TEXTS, bge_m3_out["colbert_vecs"], bge_m3_out["lexical_weights"], strict=True
    ):
        n_tokens = len(tokenizer(text, truncation=True, max_length=512)["input_ids"])
        assert vecs.shape == (n_tokens - 1, HIDDEN)  # CLS dropped, </s> kept
        assert not {int(k) for k in lw} & set(BGE_M3_IDS.values())
        assert all(w > 0 for w in lw.values())
    assert bge_m3_out["colbert_vecs"][6].shape[0] == 511  # truncated at 512 tokens, not 8192
    assert "3" not in bge_m3_out["lexical_weights"][4]  # emoji -> <unk>, dropped


def test_bge_m3_dense_matches_sentence_transformers(bge_m3: Path, bge_m3_out: dict) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(bge_m3), device="cpu")
    model.max_seq_length = 512
    np.testing.assert_allclose(model.encode(TEXTS), bge_m3_out["dense_vecs"], atol=1e-5)


def test_bge_m3_matches_real_flagembedding(bge_m3: Path, bge_m3_out: dict) -> None:
    pytest.importorskip("FlagEmbedding", exc_type=ImportError)
    real = ref.flagembedding_encode(bge_m3, TEXTS)
    np.testing.assert_allclose(real["dense_vecs"], bge_m3_out["dense_vecs"], atol=1e-5)
    _assert_same_vectors(list(real["colbert_vecs"]), bge_m3_out["colbert_vecs"])
    for a, b in zip(real["lexical_weights"], bge_m3_out["lexical_weights"], strict=True):
        assert list(a) == list(b)
        np.testing.assert_allclose([float(a[k]) for k in a], [b[k] for k in a], atol=1e-6)
