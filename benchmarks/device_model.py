"""The device run's model: BERT-base as bge-base-en-v1.5 ships it, with seeded weights,
saved by sentence-transformers' own ``save`` (Transformer, CLS Pooling, Normalize) over the
bert-base-uncased tokenizer, so Ember and Infinity load the same folder.

Run with the Python (and PYTHONPATH) of the oldest sentence-transformers that must read it:
on the device, Infinity's 3.x, whose module paths every later release still reads.

    python benchmarks/device_model.py OUT --tokenizer DIR [--tiny]
"""

from __future__ import annotations

import argparse
from pathlib import Path

BGE_BASE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
}
# The CPU smoke run's: the same vocabulary and positions, a network that costs little.
TINY = {**BGE_BASE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128}  # fmt: skip


def build(out: Path, tokenizer: Path, tiny: bool = False, seed: int = 0) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    raw = out.with_name(out.name + "-network")
    torch.manual_seed(seed)
    BertModel(BertConfig(**(TINY if tiny else BGE_BASE)), add_pooling_layer=False).save_pretrained(
        str(raw)
    )
    BertTokenizerFast.from_pretrained(str(tokenizer), model_max_length=512).save_pretrained(
        str(raw)
    )
    word = models.Transformer(str(raw), max_seq_length=512)
    pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="cls")
    SentenceTransformer(modules=[word, pooling, models.Normalize()]).save(str(out))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tokenizer", type=Path, required=True, help="bert-base-uncased's files")
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    build(args.out, args.tokenizer, args.tiny)
    print(args.out)


if __name__ == "__main__":
    main()
