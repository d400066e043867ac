"""Heads: what happens after the forward pass, shared by every backend.

A head turns a batch's named outputs (``ember.batch.Outputs``) into one result
per input: a pooled vector (``dense``), one vector per token (``multi``), a sparse vector
(``sparse``) or logits (``logits``): the rows of a type in ``ember.outputs``, which owns
request-level finishing (normalisation, Matryoshka, activation, MaxSim, cosine);
``quantize`` holds the --embedding-dtype encodings.
"""
