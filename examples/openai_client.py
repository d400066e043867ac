"""Embeddings through the official OpenAI SDK, pointed at Ember.

make serve            # in another terminal
python examples/openai_client.py
"""

import os

import numpy as np
from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("EMBER_URL", "http://127.0.0.1:7997") + "/v1",
    api_key=os.environ.get("EMBER_API_KEY", "not-needed-without---api-key"),
)
model = os.environ.get("EMBED_MODEL", "sentence-transformers/all-MiniLM-L6-v2")

texts = ["A cat sleeps on the sofa.", "A kitten naps on the couch.", "Stock prices fell."]
response = client.embeddings.create(model=model, input=texts)
vectors = np.array([item.embedding for item in response.data])
print(f"{len(vectors)} vectors of {vectors.shape[1]} dims, {response.usage.prompt_tokens} tokens")
print(f"cat~kitten {vectors[0] @ vectors[1]:.3f}   cat~stocks {vectors[0] @ vectors[2]:.3f}")

short = client.embeddings.create(model=model, input=texts[0], dimensions=128)
print(f"Matryoshka: {len(short.data[0].embedding)} dims")
