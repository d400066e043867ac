"""Ember in-process, no server: the blocking Python API.

python examples/embedded.py
"""

from ember.engine import SyncEngineArray

with SyncEngineArray(device="cpu") as ember:  # no model id: the packaged all-MiniLM-L6-v2
    vectors = ember.embed(["How do I bake bread?", "Bread baking for beginners", "Tax forms"])
    print(vectors.shape, "normalised:", bool(abs((vectors[0] ** 2).sum() - 1) < 1e-5))
    print(
        "similar:",
        round(float(vectors[0] @ vectors[1]), 3),
        "unrelated:",
        round(float(vectors[0] @ vectors[2]), 3),
    )
    half = ember.embed(["How do I bake bread?"], dimensions=192)
    print("Matryoshka:", half.shape)
