"""An LLM reranker's network for torch and the ONNX export: the causal LM's decoder, then
only its answer tokens' rows of the LM head, at each input's last real position.

The full head would compute a logit per vocabulary entry at every position ([batch, seq,
151,669] for Qwen3-Reranker: 4.9 GB in float32 for 32 inputs of 256 tokens) to keep two of
them at one position; gathering the rows first makes it [batch, 2].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.modeling_outputs import SequenceClassifierOutput

from ember.errors import ConfigError


class AnswerTokenScorer(torch.nn.Module):
    """``forward(input_ids, attention_mask) -> logits [batch, len(token_ids)]``: the LM's
    logits of ``token_ids`` at each row's last attended position (rows right-padded, as
    Ember's processors pad them)."""

    def __init__(self, lm: Any, token_ids: Sequence[int]) -> None:
        super().__init__()
        head = lm.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ConfigError(f"{type(lm).__name__}: an LM head with a bias is not supported")
        if getattr(lm.config, "final_logit_softcapping", None):
            raise ConfigError(f"{type(lm).__name__}: soft-capped logits are not supported")
        self.decoder = lm.base_model
        self.config = lm.config
        # float32 rows: the last product and the difference of two logits keep their
        # precision when the decoder runs in half precision.
        rows = head.weight.detach()[torch.tensor(list(token_ids))].float().clone()
        self.register_buffer("rows", rows, persistent=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> SequenceClassifierOutput:
        states = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        last = attention_mask.sum(dim=1) - 1
        picked = states[torch.arange(states.shape[0], device=states.device), last]
        return SequenceClassifierOutput(logits=picked.float() @ self.rows.T)
