"""A small retrieval loop: embed a corpus, retrieve by cosine, rerank the candidates.

Needs a server with an embedding model and a reranker, e.g.
    ember serve --model-id sentence-transformers/all-MiniLM-L6-v2 \
                --model-id cross-encoder/ms-marco-MiniLM-L6-v2
"""

import os

import httpx
import numpy as np

URL = os.environ.get("EMBER_URL", "http://127.0.0.1:7997")
KEY = os.environ.get("EMBER_API_KEY")
EMBED_MODEL = os.environ.get("EMBED_MODEL", "sentence-transformers/all-MiniLM-L6-v2")
RERANK_MODEL = os.environ.get("RERANK_MODEL", "cross-encoder/ms-marco-MiniLM-L6-v2")

CORPUS = [
    "The Eiffel Tower is in Paris.",
    "Python is a programming language.",
    "Paris is the capital of France.",
    "The Louvre is the world's most-visited museum.",
    "Bananas are rich in potassium.",
    "France borders Spain, Italy and Germany.",
]

headers = {"Authorization": f"Bearer {KEY}"} if KEY else {}
with httpx.Client(base_url=URL, headers=headers, timeout=60) as http:

    def embed(texts: list[str]) -> np.ndarray:
        body = http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": texts})
        body.raise_for_status()
        return np.array([d["embedding"] for d in body.json()["data"]])

    index = embed(CORPUS)
    query = "What is the capital city of France?"
    scores = index @ embed([query])[0]
    candidates = [CORPUS[i] for i in np.argsort(-scores)[:4]]
    print("retrieved:", candidates)

    reranked = http.post(
        "/v1/rerank",
        json={
            "model": RERANK_MODEL,
            "query": query,
            "documents": candidates,
            "top_n": 2,
            "return_documents": True,
        },
    )
    reranked.raise_for_status()
    for result in reranked.json()["results"]:
        print(f"{result['relevance_score']:.4f}  {result['document']['text']}")
