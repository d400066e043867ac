"""The front end's floor: the least code that serves OpenAI embeddings from a static table
on Ember's own stack (FastAPI, uvicorn, pydantic, orjson, ``tokenizers``, numpy).

Tokenise, average each input's rows, answer: no batcher, no queue, no metrics, no limits.
``benchmarks/frontend.py`` serves the same sentence-transformers StaticEmbedding folder
with ``ember serve`` beside it and compares the two under the same loads.

    FRONTEND_FLOOR_MODEL=DIR python -m uvicorn benchmarks.frontend_floor:app --port 8001
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel
from safetensors.numpy import load_file
from tokenizers import Tokenizer

MODEL = Path(os.environ.get("FRONTEND_FLOOR_MODEL", "."))


class EmbeddingsBody(BaseModel):
    input: str | list[str]
    model: str = "floor"


def _load() -> tuple[Tokenizer, np.ndarray]:
    tokenizer = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    tokenizer.no_truncation()
    table = load_file(str(MODEL / "model.safetensors"))["embedding.weight"]
    return tokenizer, np.ascontiguousarray(table, dtype=np.float32)


app = FastAPI()
TOKENIZER, TABLE = _load() if (MODEL / "tokenizer.json").exists() else (None, None)


@app.get("/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


@app.post("/v1/embeddings")
async def embeddings(body: EmbeddingsBody) -> Response:
    assert TOKENIZER is not None and TABLE is not None, "FRONTEND_FLOOR_MODEL is not a model"
    texts = [body.input] if isinstance(body.input, str) else body.input
    encodings = TOKENIZER.encode_batch(texts, add_special_tokens=False)
    vectors = [TABLE[e.ids].mean(axis=0) for e in encodings]
    tokens = sum(len(e.ids) for e in encodings)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    payload = {
        "object": "list",
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )
