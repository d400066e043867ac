"""PyTorch for media models: one tower per modality (CLIP, SigLIP, CLAP) or a retrieval
VLM (ColPali, ColQwen2), fed exactly the arrays the model's processor produced.

Dual encoders return each tower's projected output (``get_text_features``,
``get_image_features``, ``get_audio_features``; in transformers 5 the ``pooler_output``
of what they return); retrieval VLMs their projected, normalised token vectors and the
mask they were computed with, which the multi-vector head cuts each row to.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from ember.backends.base import BackendInfo
from ember.backends.torch_placement import TorchPlacement, take_preloaded
from ember.batch import ATTENTION, EMBEDDINGS, TOKEN_STATES, Batch, FeatureBatch, Outputs
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

import torch  # noqa: E402  (checked first by the caller: ember.backends.torch_backend)

# The tower method per modality of a dual encoder.
TOWERS = {"text": "get_text_features", "image": "get_image_features", "audio": "get_audio_features"}


def load_media_net(model: ResolvedModel, dtype: torch.dtype) -> Any:
    """A media model's network on the CPU, in ``dtype``."""
    import transformers

    assert model.family.media is not None
    net_class = getattr(transformers, model.family.media.net_class)
    options: dict[str, Any] = {"dtype": dtype, "trust_remote_code": model.runtime.trust_remote_code}
    try:
        return net_class.from_pretrained(str(model.path), attn_implementation="sdpa", **options)
    except ValueError:  # a tower without an SDPA kernel in transformers
        return net_class.from_pretrained(str(model.path), **options)


def _accepted(call: Callable[..., Any]) -> frozenset[str] | None:
    """The arrays a tower takes by name; None: all (it passes ``**kwargs`` on, as ColPali
    passes ``token_type_ids`` to PaliGemma)."""
    params = inspect.signature(call).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


class TorchMediaBackend(TorchPlacement):
    def __init__(self, model: ResolvedModel) -> None:
        self._place(model)
        net = take_preloaded(model, self.dtype) or load_media_net(model, self.dtype)
        self.net = net.to(self.device).eval()
        self.backbone = model.backbone
        self._calls: dict[str, Callable[..., Any]] = {}
        self._accepts: dict[str, frozenset[str] | None] = {}
        modalities = model.family.modalities
        for modality in modalities:
            call = (
                getattr(self.net, TOWERS[modality])
                if self.backbone == "dual-encoder"
                else self.net.forward
            )
            self._calls[modality] = call
            self._accepts[modality] = _accepted(call)
        self.info = BackendInfo(
            name="torch",
            device=self.device,
            dtype=str(self.dtype).removeprefix("torch."),
            details={
                "attention": str(getattr(self.net.config, "_attn_implementation", "eager")),
                "forwards": f"{self.parallel_forwards}x{self.threads or 'all'} threads",
                "towers": ",".join(modalities),
            },
        )

    def forward(self, batch: Batch) -> Outputs:
        if not isinstance(batch, FeatureBatch):
            raise ConfigError("a media model's backend takes a FeatureBatch")
        self._thread_setup()
        accepts = self._accepts[batch.modality]
        with torch.inference_mode():
            inputs = {}
            for name, array in batch.arrays.items():
                if accepts is not None and name not in accepts:
                    continue
                tensor = torch.from_numpy(array).to(self.device)
                if tensor.is_floating_point():
                    tensor = tensor.to(self.dtype)
                inputs[name] = tensor
            out = self._calls[batch.modality](**inputs)
            if self.backbone == "dual-encoder":
                pooled = getattr(out, "pooler_output", out)
                return {EMBEDDINGS: pooled.float().cpu().numpy()}
            outputs = {TOKEN_STATES: out.embeddings.float().cpu().numpy()}
            if "attention_mask" in batch.arrays:
                outputs[ATTENTION] = batch.arrays["attention_mask"]
            return outputs


def load(model: ResolvedModel) -> TorchMediaBackend:
    return TorchMediaBackend(model)
