"""BGE-M3: dense (CLS), sparse (``sparse_linear``) and ColBERT (``colbert_linear``) heads
over one forward; it reranks by MaxSim on its ColBERT vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.families.base import Family, ModelFiles, lazy

if TYPE_CHECKING:
    from ember.capabilities import Output
    from ember.heads.base import Head
    from ember.models.spec import ResolvedModel

HEAD_FILES = ("colbert_linear.pt", "sparse_linear.pt")


def heads(model: ResolvedModel) -> dict[Output, Head]:
    from ember.heads.dense import DenseHead
    from ember.heads.multivector import MultiVectorHead
    from ember.heads.sparse import LexicalWeightsHead
    from ember.models.weights import read_tensors
    from ember.processors.text import declared_token_ids, load_tokenizer

    assert model.root is not None
    colbert, sparse = (read_tensors(model.root / name) for name in HEAD_FILES)
    names = ("cls_token", "eos_token", "pad_token", "unk_token")  # FlagEmbedding's unused ids
    dropped = frozenset(declared_token_ids(load_tokenizer(model.path), model.path, names).values())
    return {
        "dense": DenseHead(model.pooling),
        "sparse": LexicalWeightsHead(sparse["weight"], sparse["bias"], dropped),
        "multi": MultiVectorHead(colbert["weight"], colbert["bias"], skip_first=True),
    }


def detect(files: ModelFiles) -> bool:
    return files.has(*HEAD_FILES) and files.task == "embed"


BGE_M3 = Family(
    name="bge-m3",
    title="BGE-M3",
    backbone="encoder",
    outputs=("dense", "sparse", "multi"),
    detect=detect,
    resolve=lazy("ember.models.pipeline", "resolve_pipeline"),
    heads=heads,
    processor=lazy("ember.processors.text", "TextTokenizer"),
    detected_by="`colbert_linear.pt` and `sparse_linear.pt` beside the weights",
    example="BAAI/bge-m3",
    scoring="maxsim",
    exportable=False,
)
