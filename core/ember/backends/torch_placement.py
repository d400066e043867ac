"""What the text and media torch backends share: torch itself, the device and dtype a
model's settings resolve to, the CPU forward plan, and networks preloaded on the CPU."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from ember.backends.base import BackendDefaults
from ember.backends.gpu_check import torch_cuda_check
from ember.cpu import cpu_forward_plan
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

try:
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None  # type: ignore[assignment]


def resolve_device(device: str) -> str:
    if device != "auto":
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda asked for, but torch sees no CUDA device")
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    torch_cuda_check(torch)  # a GPU host where torch sees no CUDA fails here, not on CPU
    return "cpu"


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "int8":
        raise ConfigError("--dtype int8 is served by --backend onnx or ct2, not torch")
    if dtype == "auto":
        return torch.float16 if device == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


def configure_cpu_threads() -> None:
    # Inter-op parallelism only adds contention on a small CPU; intra-op threads are set
    # per forward thread (OpenMP's thread count is per calling thread), see forward().
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass


def cpu_has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# Forward passes at once on a GPU (``--forward-workers`` overrides): one computes while the
# other's host work (collate, copies, heads) runs.
CUDA_FORWARDS = 2

# Networks loaded ahead on the CPU (``preload_weights``), by model directory and dtype.
_PRELOADED: dict[tuple[str, str], Any] = {}


def take_preloaded(model: ResolvedModel, dtype: torch.dtype) -> Any | None:
    """The network ``preload_weights`` loaded for this model and dtype (once), or None."""
    return _PRELOADED.pop((str(model.path), str(dtype)), None)


class TorchPlacement(BackendDefaults):
    """Device, dtype and CPU forward plan: what the text and media torch backends share."""

    net: Any

    def _place(self, model: ResolvedModel) -> None:
        self.device = resolve_device(model.runtime.device)
        self.dtype = resolve_dtype(model.runtime.dtype, self.device)
        # CPU: several single-threaded forwards at once instead of one on a thread pool
        # (barrier stalls under contention: ember.cpu.cpu_forward_plan). GPU: one.
        self.parallel_forwards, self.threads = 1, 0
        self._thread_state = threading.local()
        if self.device == "cuda":
            # Two forwards in flight, each thread on a CUDA stream of its own: while one
            # waits for its outputs to come back (the GIL released), the other collates,
            # copies in and launches, so the GPU does not idle through host-side work.
            self.parallel_forwards = model.runtime.forward_workers or CUDA_FORWARDS
        if self.device == "cpu":
            configure_cpu_threads()
            self.parallel_forwards, self.threads = cpu_forward_plan(model.runtime.forward_workers)
            if self.dtype == torch.bfloat16 and not cpu_has_native_bf16():
                log.warning(
                    "bfloat16 on a CPU without AVX512-BF16/AMX is emulated and slower than "
                    "float32; use --dtype float32, or --backend onnx/ct2 --dtype int8 for speed"
                )

    def _thread_setup(self) -> None:
        """This forward thread's OpenMP team size (it is per calling thread), set once."""
        if self.threads and getattr(self._thread_state, "threads", 0) != self.threads:
            torch.set_num_threads(self.threads)
            self._thread_state.threads = self.threads

    def _stream(self) -> contextlib.AbstractContextManager[Any]:
        """This forward thread's own CUDA stream (made once per thread); nothing on CPU."""
        if self.device != "cuda":
            return contextlib.nullcontext()
        stream = getattr(self._thread_state, "stream", None)
        if stream is None:
            stream = self._thread_state.stream = torch.cuda.Stream()
        return torch.cuda.stream(stream)

    def close(self) -> None:
        self.net = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
