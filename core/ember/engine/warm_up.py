"""A model's warm-up before it serves: one batch per forward worker, then one real request
per head, so that the first requests meet warm threads and admission prices them from a
measured rate.

On an accelerator the batch has the largest shape the batcher can form, so running out of
device memory shows at start, not under load. On CPU memory grows on demand and kernels are
not shape-specialised, and a largest-shape batch was 80% of the cold start (4.4 of 5.5 s for
MiniLM on ct2), so one batch of a few hundred tokens warms the threads. The batch runs after
a cold pass (on CPU a short one); that second, warm, run is the first measured rate
admission prices a request's own cost at (a cold server admits any size).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ember.engine.forward import Piece
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.outputs import embeds

if TYPE_CHECKING:
    from ember.engine.engine import Engine

# Tokens per input of the CPU warm-up batch, the model's max length if shorter: long
# inputs, since a request that alone may miss its deadline is mostly long texts, and their
# tokens cost more each than short ones' (MiniLM on 2 cores: 256-token texts ran at 0.8x
# the tokens/s of 16-token ones).
CPU_WARM_UP_LENGTH = 512
# The CPU warm-up's first, unmeasured pass per forward thread: a few tokens.
CPU_COLD_PASS_LENGTH = 16
# What each model embeds, reranks or classifies as its first request: ordinary English, so
# that the characters per token measured from it (``TextCost``) price the first requests
# that follow about right, as "warm-up" (1.4 characters a token) did not.
WARM_UP_TEXT = "A short sentence of ordinary English that warms the model up before it serves."


async def warm_up(engine: Engine) -> float:
    """Warm ``engine``'s model up (started, not yet ready); returns the seconds it took."""
    batcher, processor, backend = engine.batcher, engine.processor, engine.backend
    assert batcher and processor and backend
    started = time.perf_counter()
    length = processor.max_length
    count = max(1, min(batcher.max_batch_size, engine.spec.max_batch_tokens // length))
    if backend.info.device == "cpu":
        length = min(length, CPU_WARM_UP_LENGTH)
        wanted = -(-batcher.representative_tokens // length)
        count = max(1, min(batcher.max_batch_size, wanted))
    outputs = engine.family.outputs
    largest = [Piece(processor.filler(length), outputs[0])] * count
    first = largest
    if backend.info.device == "cpu":
        # The cold pass only starts threads and allocates: a short one does that on CPU,
        # where kernels are not shape-specialised (two full passes were 0.45-0.55 s of
        # the slim image's ~3 s to ready on a 2-core host).
        first = [Piece(processor.filler(CPU_COLD_PASS_LENGTH), outputs[0])]
    # Once per forward worker at the same time, so every worker thread is warm too.
    for batch, measure in ((first, False), (largest, True)):
        await asyncio.gather(*(batcher.run_direct(batch, measure) for _ in range(batcher.workers)))
    for output in outputs:
        if embeds(output):
            warm = EmbedRequest([WARM_UP_TEXT], output=output)  # not cached, not counted
            await engine.embed_uncounted(warm)
    for modality in engine.family.modalities[1:]:  # each media tower once, decoded inputs
        item = processor.warm_up_item(modality)  # type: ignore[attr-defined]
        await batcher.run_direct([Piece(item, outputs[0])])
    if engine.family.scoring is not None:
        await engine.rerank(RerankRequest(WARM_UP_TEXT, [WARM_UP_TEXT]))
    if engine.family.classifies:
        await engine.classify(ClassifyRequest([WARM_UP_TEXT]))
    return time.perf_counter() - started
