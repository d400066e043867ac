"""Heads: what happens after the forward pass, shared by every backend.

A head turns a batch's named outputs (``ember.batch.Outputs``) into one result
per input: a pooled vector (``dense``), one vector per token (``multi``), a sparse vector
(``sparse``) or logits (``logits``). Request-level finishing (normalisation, Matryoshka,
output types, scores) is in ``postprocess``, ``quantize`` and ``scores``.
"""
