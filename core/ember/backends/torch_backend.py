"""PyTorch backend: transformers models in inference mode, on packed (unpadded) token
streams with PyTorch's varlen attention where the GPU and architecture allow
(``ember.backends.torch_varlen``), on padded batches with SDPA elsewhere."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ember.backends import torch_varlen
from ember.backends.base import Backend, BackendInfo, PaddingBudget
from ember.backends.torch_placement import (
    _PRELOADED,
    TorchPlacement,
    resolve_device,
    resolve_dtype,
    take_preloaded,
    torch,
)
from ember.backends.torch_reduce import reduce_padded, reduce_stream, reduced_outputs
from ember.batch import LOGITS, TOKEN_STATES, Outputs, TokenBatch
from ember.capabilities import MEDIA_BACKBONES
from ember.errors import MissingDependency
from ember.models.network import network_class
from ember.models.spec import ResolvedModel

# resolve_device: the device this backend loads on (the GPU check runs through it).
__all__ = ["TorchBackend", "load", "load_net", "preload_weights", "resolve_device"]

# Packed batches carry no padding: the batcher cuts them by their real tokens alone.
PACKED = PaddingBudget(tokens=0, fraction=0.0, packed=True)


def load_net(model: ResolvedModel, dtype: torch.dtype, attention: str) -> Any:
    """The model's network on the CPU, in ``dtype`` (the backend moves it to its device)."""
    auto = network_class(model)
    try:
        net = auto.from_pretrained(
            str(model.path),
            dtype=dtype,
            attn_implementation=attention,
            trust_remote_code=model.runtime.trust_remote_code,
        )
    except ValueError:  # architectures without an SDPA kernel in transformers
        net = auto.from_pretrained(
            str(model.path), dtype=dtype, trust_remote_code=model.runtime.trust_remote_code
        )
    if rows := model.facts.answer_tokens:  # the decoder and its answer tokens' rows
        from ember.backends.torch_causal import AnswerTokenScorer

        return AnswerTokenScorer(net, rows)
    return net


def preload_weights(model: ResolvedModel, device: str) -> None:
    """Load ``model``'s network on the CPU now, in the dtype it will be served in on
    ``device``, for the backend to take and move there later: a memory snapshot taken in
    between (Modal's ``enter(snap=True)``, before the GPU is attached) holds the weights,
    so a restored container only copies them to the GPU."""
    dtype = resolve_dtype(model.runtime.dtype, device)
    if model.backbone in MEDIA_BACKBONES:
        from ember.backends.torch_media import load_media_net

        net = load_media_net(model, dtype)
    else:
        net = load_net(model, dtype, TorchBackend._attention(device, dtype))
    _PRELOADED[(str(model.path), str(dtype))] = net.eval()


class TorchBackend(TorchPlacement):
    def __init__(self, model: ResolvedModel) -> None:
        self._place(model)
        attention = self._attention(self.device, self.dtype)
        net = take_preloaded(model, self.dtype) or load_net(model, self.dtype, attention)
        self.net = net.to(self.device).eval()
        self._call = self.net
        params = inspect.signature(self.net.forward).parameters
        self.takes_token_types = "token_type_ids" in params
        self.output = TOKEN_STATES if model.backbone == "encoder" else LOGITS
        self.unpadded_reason = self._pack_if_possible()
        # Pool on the GPU what a dense head would pool (TokenBatch.reduce): the copy back
        # and the host's pooling shrink to a vector per row. On the CPU the head pools.
        self.reduce_on_device = self.device == "cuda"
        if self.packed:
            attention = torch_varlen.ATTENTION_NAME
        # FlashAttention-2 and packed streams drop masked positions: a position masked
        # from attention but wanted (ColBERT's query expansion) gets no state.
        self.masked_positions = attention not in ("flash_attention_2", torch_varlen.ATTENTION_NAME)
        self.info = BackendInfo(
            name="torch",
            device=self.device,
            dtype=str(self.dtype).removeprefix("torch."),
            details={
                "attention": str(getattr(self.net.config, "_attn_implementation", "eager")),
                "unpadded": "yes" if self.packed else f"no: {self.unpadded_reason}",
                "forwards": f"{self.parallel_forwards}x{self.threads or 'all'} threads",
                "compiled": str(model.runtime.torch_compile).lower(),
            },
        )
        if model.runtime.torch_compile:
            self._compile()

    # Batches run once while loading so torch.compile has built every graph serving needs:
    # (rows, length, padded). Different sizes make batch and length dynamic; padded and
    # unpadded masks, and a batch of one, cover branches that some torch/transformers
    # versions specialise (tests/integration/test_torch_compile.py checks none is left).
    COMPILE_BATCHES = ((2, 12, True), (3, 20, True), (2, 12, False), (3, 20, False), (1, 16, False))

    def _compile(self) -> None:
        """Compile now rather than on the first requests, which would wait a minute."""
        self._call = torch.compile(self.net, dynamic=True)
        token = min(1000, int(getattr(self.net.config, "vocab_size", 1001)) - 1)
        for rows, length, padded in self.COMPILE_BATCHES:
            ids = np.full((rows, length), token, dtype=np.int64)
            mask = np.ones((rows, length), dtype=np.int64)
            if padded:
                ids[-1, length // 2 :], mask[-1, length // 2 :] = 0, 0
            self.forward(TokenBatch(ids, mask, np.zeros_like(ids)))

    def _pack_if_possible(self) -> str | None:
        """Switch the network to packed forwards where it can run them; why not, else."""
        self.packed = False
        if self.output != TOKEN_STATES:
            return "the model's own head pools the padded batch (logits)"
        reason = torch_varlen.unsupported_reason(self.net, self.device, self.dtype)
        if reason is None:
            self.net.set_attn_implementation(torch_varlen.register())
            self.position_offset = torch_varlen.position_offset(self.net)
            self.padding = PACKED
            self.packed = True
        return reason

    @staticmethod
    def _attention(device: str, dtype: torch.dtype) -> str:
        """flash-attn on CUDA in half precision when installed: transformers then unpads the
        batch (varlen kernels), so mixed lengths do no work on padding. SDPA otherwise."""
        if device == "cuda" and dtype in (torch.float16, torch.bfloat16):
            import importlib.util

            if importlib.util.find_spec("flash_attn") is not None:
                return "flash_attention_2"
        return "sdpa"

    def forward(self, batch: TokenBatch) -> Outputs:
        self._thread_setup()
        with self._stream():
            if self.packed and not torch_varlen.has_holes(batch.attention_mask):
                return self._forward_packed(batch)
            return self._forward_padded(batch)

    def _put(self, array: np.ndarray) -> Any:
        """A host array on the device: through page-locked memory, asynchronously, on CUDA."""
        tensor = torch.from_numpy(array)
        if self.device == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def _forward_padded(self, batch: TokenBatch) -> Outputs:
        with torch.inference_mode():
            ids = self._put(batch.input_ids)
            mask = self._put(batch.attention_mask)
            kwargs = {"input_ids": ids, "attention_mask": mask}
            if self.takes_token_types:
                kwargs["token_type_ids"] = self._put(batch.token_type_ids)
            if batch.adapter is not None:  # the model's own LoRA task adapter, every row
                rows = (ids.shape[0],)
                kwargs["adapter_mask"] = torch.full(
                    rows, batch.adapter, dtype=torch.int32, device=self.device
                )
            out = self._call(**kwargs)
            if self.output != TOKEN_STATES:
                return {self.output: out.logits.float().cpu().numpy()}
            if batch.reduce is not None and self.reduce_on_device:
                return reduced_outputs(reduce_padded(out.last_hidden_state, mask, batch.reduce))
            return {TOKEN_STATES: out.last_hidden_state.float().cpu().numpy()}

    def _forward_packed(self, batch: TokenBatch) -> Outputs:
        """The batch's real tokens as one stream; states scattered back to the padded
        layout on the device, so heads see what a padded forward gives them."""
        packed = torch_varlen.pack(batch, self.position_offset)
        with torch.inference_mode():
            kwargs = torch_varlen.packed_inputs(packed, self._put)
            if not self.takes_token_types:
                del kwargs["token_type_ids"]
            if batch.adapter is not None:
                kwargs["adapter_mask"] = torch.full(
                    (1,), batch.adapter, dtype=torch.int32, device=self.device
                )
            stream = self._call(**kwargs).last_hidden_state[0]
            if batch.reduce is not None and self.reduce_on_device:
                cu = kwargs["cu_seq_lens_q"]
                return reduced_outputs(reduce_stream(stream, cu, batch.reduce))
            states = torch_varlen.unpack(stream, packed)
            return {TOKEN_STATES: states.float().cpu().numpy()}


def load(model: ResolvedModel) -> Backend:
    if torch is None:
        raise MissingDependency("the torch backend needs PyTorch: pip install 'ember[torch]'")
    if model.backbone in MEDIA_BACKBONES:
        from ember.backends.torch_media import TorchMediaBackend

        return TorchMediaBackend(model)
    return TorchBackend(model)
