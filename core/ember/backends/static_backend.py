"""The numpy backend: sentence-transformers' static modules, a table lookup per token.

``StaticEmbedding`` (static-retrieval-mrl-en-v1, model2vec models) is an ``EmbeddingBag``
in mean mode: a text's vector is the mean of its tokens' rows of the table (no tokens: a
zero vector). ``SparseStaticEmbedding`` (the IDF query side of OpenSearch's inference-free
sparse models) gives each token id present in the text its weight, once however often it
occurs. No network runs, so nothing but numpy is imported: serving one never loads torch or
ONNX Runtime, and a forward is a gather and a sum.
"""

from __future__ import annotations

import logging

import numpy as np

from ember.backends.base import BackendDefaults, BackendInfo
from ember.batch import EMBEDDINGS, Batch, Outputs
from ember.cpu import cpu_forward_plan
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel
from ember.models.weights import read_checkpoint
from ember.processors.text import load_tokenizer

log = logging.getLogger(__name__)


def read_table(model: ResolvedModel) -> np.ndarray:
    """The module's table as sentence-transformers loads it: ``embedding.weight``, or a
    model2vec file's ``embeddings`` with its ``mapping`` and per-token ``weights`` folded in
    (``StaticEmbedding._fold_model2vec_weights``); a SparseStaticEmbedding's ``weight``."""
    facts = model.family.table
    assert facts is not None
    if not facts.mean:
        table = next(iter(read_checkpoint(model.path, facts.weights).values()), None)
    else:
        t = read_checkpoint(model.path, (*facts.weights, "mapping", "weights"))
        table = t.get(facts.weights[0])
        if table is None and "embeddings" in t:
            table = t["embeddings"]
            if "mapping" in t:
                table = table[t["mapping"].astype(np.int64)]
            if "weights" in t:
                table = table * t["weights"][:, None]
    if table is None:
        raise ConfigError(f"{model.path}: no {model.family.name} table in the weights")
    vocab = load_tokenizer(model.path).get_vocab_size(with_added_tokens=True)
    if table.shape[0] < vocab:
        raise ConfigError(
            f"{model.path}: the table has {table.shape[0]} rows for a tokenizer of {vocab} ids"
        )
    return np.ascontiguousarray(table, dtype=np.float32)


class StaticBackend(BackendDefaults):
    """``forward`` -> ``EMBEDDINGS``: [batch, dim] means, or [batch, vocab] weights."""

    def __init__(self, model: ResolvedModel) -> None:
        assert model.family.table is not None
        runtime = model.runtime
        if runtime.device not in ("auto", "cpu") or runtime.dtype not in ("auto", "float32"):
            log.warning(
                "model %s: a %s table is served by numpy on the CPU in float32 (asked: "
                "--device %s --dtype %s)",
                model.served_name,
                model.family.name,
                model.runtime.device,
                model.runtime.dtype,
            )
        self.table = read_table(model)
        self.mean = model.family.table.mean
        # Forward workers as the other CPU backends plan them (ember.cpu.cpu_forward_plan):
        # a forward is a few milliseconds of numpy, next to the request's JSON on the loop.
        self.parallel_forwards = cpu_forward_plan(model.runtime.forward_workers)[0]
        self.info = BackendInfo(
            "numpy",
            "cpu",
            "float32",
            {"table": "x".join(map(str, self.table.shape)), "module": model.architecture},
        )

    def forward(self, batch: Batch) -> Outputs:
        mask = batch.attention_mask > 0  # type: ignore[union-attr]
        ids = batch.input_ids[mask]  # type: ignore[union-attr]  # each row's real ids, in order
        lengths = mask.sum(axis=1)
        rows = len(lengths)
        if self.mean:
            out = np.zeros((rows, self.table.shape[1]), dtype=np.float32)
            gathered = self.table[ids]
            # A sum per row over its contiguous rows of the gather: np.add.reduceat on
            # axis 0 walks the columns with a stride and ran 18x slower (35 vs 1.9 ms for
            # 32 texts of a 1,024-wide table on a 2-core EPYC).
            end = 0
            for row, length in enumerate(lengths.tolist()):
                if length:
                    start, end = end, end + length
                    np.sum(gathered[start:end], axis=0, out=out[row])
                    out[row] /= np.float32(length)
            return {EMBEDDINGS: out}
        weights = np.zeros((rows, self.table.shape[0]), dtype=np.float32)
        weights[np.repeat(np.arange(rows), lengths), ids] = self.table[ids]
        return {EMBEDDINGS: weights}

    def close(self) -> None:
        self.table = np.zeros((0, 0), dtype=np.float32)


def load(model: ResolvedModel) -> StaticBackend:
    return StaticBackend(model)
