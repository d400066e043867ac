"""``--backend auto``'s near-exact path: bfloat16 where the CPU multiplies it natively and
the model stays within reach of float32.

A CPU with AVX512-BF16 or AMX runs bf16 matmuls at about twice its fp32 rate. The candidate
is OpenVINO at bf16 precision over the onnx backend's own graph (``openvino_backend``):
on the project's 2-core Zen 4, all-MiniLM-L6-v2, one thread per forward, it took 335-476
ms per batch of 32 against 783-1255 for ORT fp32 and 755-1271 for torch bf16, which also
missed the probe's bar (worst cosine 0.999895). Whether a
given model keeps its answers in bf16 is not known ahead, so the first load checks it: the
fp32 backend auto picked and the bf16 candidate both run a fixed probe set of
``PROBE_SIZE`` inputs of mixed length, and the candidate serves only if its worst cosine
to fp32 is at least ``COSINE_FLOOR`` (a classifier's or reranker's scores: within
``SCORE_TOLERANCE`` after the activation). Otherwise fp32 stays. The decision is cached
with the artifacts, keyed by the model's files, the CPU kind and the runtimes' versions,
so later starts load one backend; ``--dtype float32`` (any ``--dtype``) skips it all.

Where it applies: a text encoder pooled to one vector, a sequence classifier, or a dual
encoder's towers where auto serves them on onnx (CLIP: OpenVINO over the onnx tower graphs,
``openvino_media``, probed on the texts and on ``PROBE_SIZE`` images of mixed size,
``probe_set``), whose family runs on onnx, on a CPU, with ``--backend auto`` and no
``--dtype``. SigLIP (on torch), CLAP (no ONNX graph), multi-vector and sparse outputs and
LLM rerankers keep float32 (no probe compares them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib.util import find_spec
from typing import Any

import numpy as np

import ember.backends.artifacts as artifacts
from ember import cpu
from ember.backends.base import Backend
from ember.backends.probe_set import PROBE_SIZE, probe_images, probe_pairs, probe_texts
from ember.backends.upgrade import Upgradable
from ember.models.spec import ResolvedModel
from ember.outputs import is_dense

log = logging.getLogger(__name__)

CANDIDATE = ("openvino", "bfloat16")  # the near-exact path: runtime, dtype
COSINE_FLOOR = 0.9999
SCORE_TOLERANCE = 1e-3
PROBE_VERSION = 2  # bump when the probe set or its comparison changes
_BATCH = 8
PROBED = ("encoder", "sequence-classifier", "dual-encoder")  # backbones the probe covers


@dataclass(frozen=True)
class Verdict:
    """The check's outcome: whether the candidate serves, its worst agreement, and how."""

    passed: bool
    worst: float  # the worst cosine, or the largest score difference
    metric: str  # "cosine" or "score"
    inputs: str = str(PROBE_SIZE)  # how many probe inputs: "64", "64 text and 64 image"

    def words(self) -> str:
        if self.metric == "cosine":
            bar = f"{'>=' if self.passed else '<'} {COSINE_FLOOR}"
            return f"worst cosine {self.worst:.6f} {bar} to float32"
        bar = f"{'<=' if self.passed else '>'} {SCORE_TOLERANCE:g}"
        return f"largest score difference {self.worst:.2e} {bar} to float32"


def applies(model: ResolvedModel, reference: Backend) -> str | None:
    """Why the check does not run for ``model`` served by ``reference``; None if it does."""
    if model.runtime.dtype != "auto":
        return f"--dtype {model.runtime.dtype} asked for: the exact path"
    if model.backbone not in PROBED or model.facts.answer_tokens:
        return f"no near-exact probe for {model.family.name} models yet"
    if model.task_adapters or not model.family.runs_on("onnx"):
        return f"{model.family.name} models have no ONNX graph for {CANDIDATE[0]} to run"
    outputs = model.family.outputs
    if model.backbone == "encoder" and not (len(outputs) == 1 and is_dense(outputs[0])):
        # The probe compares dense vectors; sparse weights and token vectors (BGE-M3's
        # too, beside its dense head) would be served at bf16 unchecked.
        return "no near-exact probe for multi-vector or sparse outputs yet"
    if (unit := cpu.native_bf16()) is None:
        return "this CPU has no native bf16 (AVX512-BF16 or AMX)"
    if reference.info.name not in ("onnx", "openvino"):
        # The candidate runs the onnx backend's graph (or a shipped OpenVINO IR, the one
        # auto serves at float32 on openvino): where auto chose another runtime (remote
        # code, which may not export; SigLIP's towers, ORT no faster) it stays.
        return f"auto chose {reference.info.name}: no near-exact path measured beside it"
    if find_spec("openvino") is None:
        return f"this CPU has {unit}, but openvino is not installed (pip install 'ember[openvino]')"
    return None


def decision_dir(model: ResolvedModel, reference: Backend) -> Any:
    """Where the decision for this model, reference, CPU kind and runtimes is cached."""
    options = {
        "cpu": cpu.native_bf16(),
        "candidate": "-".join(CANDIDATE),
        "reference": f"{reference.info.name}-{reference.info.dtype}",
        "versions": artifacts.package_versions(("openvino", "transformers", "onnxruntime")),
        "probe": PROBE_VERSION,
        "floor": [COSINE_FLOOR, SCORE_TOLERANCE],
    }
    return artifacts.artifact_dir(model, "near-exact", options)


def probe_inputs(model: ResolvedModel, processor: Any) -> list[tuple[str, list[Any], str]]:
    """The probe set as the model takes it: (kind, features, head) per kind of input."""
    if model.backbone == "sequence-classifier":
        return [("", processor.encode_pairs(probe_pairs()), "logits")]
    if model.backbone == "encoder":
        return [("", processor.encode(probe_texts()), "dense")]
    groups = [("text", processor.encode(probe_texts()), "dense")]
    if "image" in model.family.modalities:
        images = [processor.image_features(image, i) for i, image in enumerate(probe_images())]
        groups.append(("image", images, "dense"))
    return groups


def compare(model: ResolvedModel, reference: Backend, candidate: Backend) -> Verdict:
    """Run the probe set through both backends with the model's own processor and heads."""
    from ember.heads.build import build_heads
    from ember.processors import build_processor

    limit = min(x for x in (reference.max_length, candidate.max_length, 1 << 30) if x)
    processor = build_processor(model, None if limit == 1 << 30 else limit)
    heads = build_heads(model)
    groups = probe_inputs(model, processor)
    inputs = " and ".join(f"{len(features)} {kind}".strip() for kind, features, _ in groups)
    output = groups[0][2]

    def run(backend: Backend) -> np.ndarray:
        rows: list[Any] = []
        for _, features, head in groups:  # as the engine's run_batch: collate, forward, head
            for start in range(0, len(features), _BATCH):
                chunk = features[start : start + _BATCH]
                batch = processor.collate(chunk)
                rows += heads[head].split(backend.forward(batch), batch, range(len(chunk)))
        return np.asarray(rows, dtype=np.float64).reshape(len(rows), -1)

    exact, near = run(reference), run(candidate)
    if is_dense(output):
        norms = np.linalg.norm(exact, axis=1) * np.linalg.norm(near, axis=1)
        worst = float(((exact * near).sum(axis=1) / np.maximum(norms, 1e-12)).min())
        return Verdict(worst >= COSINE_FLOOR, worst, "cosine", inputs)
    largest = float(np.abs(_activate(exact) - _activate(near)).max())
    return Verdict(largest <= SCORE_TOLERANCE, largest, "score", inputs)


def _activate(logits: np.ndarray) -> np.ndarray:
    """Sigmoid for one label (a reranker's relevance), softmax over several (a classifier)."""
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def _cached(directory: Any) -> Verdict | None:
    manifest = artifacts.read_manifest(directory) or {}
    if manifest.get("metric") in ("cosine", "score"):
        inputs = str(manifest.get("inputs", PROBE_SIZE))
        return Verdict(
            bool(manifest["passed"]), float(manifest["worst"]), manifest["metric"], inputs
        )
    return None


def _store(directory: Any, verdict: Verdict, candidate: Sequence[str]) -> None:
    """Cache the verdict; a cache that cannot be written only means checking again."""
    try:
        with artifacts.staging(directory) as tmp:
            artifacts.write_manifest(
                tmp,
                {
                    "backend": "near-exact",
                    "candidate": "-".join(candidate),
                    "passed": verdict.passed,
                    "worst": verdict.worst,
                    "metric": verdict.metric,
                    "inputs": verdict.inputs,
                    "cpu": cpu.native_bf16(),
                },
            )
    except OSError as exc:
        log.warning("near-exact decision not cached (%s): it is checked again next start", exc)


def load_candidate(model: ResolvedModel) -> Backend:
    """The near-exact path for ``model`` (whose settings name its dtype): OpenVINO over the
    onnx backend's graph, or over its tower graphs for a dual encoder."""
    if model.backbone == "dual-encoder":
        from ember.backends.openvino_media import load as load_towers

        return load_towers(model)
    from ember.backends.openvino_backend import load

    return load(model)


def settle(
    model: ResolvedModel, reference: Backend, reason: str = ""
) -> tuple[Backend, str | None]:
    """The backend that serves ``model`` (``reference``, fp32, or the bf16 candidate) and
    the words /v1/models and the log give for it (None where precision was not auto's to
    choose: another dtype asked for, or not a float32 CPU path). With ``--near-exact-check
    background`` and no cached verdict: ``reference`` at once, wrapped so that the
    candidate takes over when the check, run on a thread, passes (``upgrade``); ``reason``:
    auto's choice, for the details the swapped-in backend then reports."""
    asked = model.runtime.dtype
    fp32_cpu = reference.info.device == "cpu" and reference.info.dtype == "float32"
    if not fp32_cpu or asked not in ("auto", "float32"):
        return reference, None
    if why_not := applies(model, reference):
        return reference, f"float32 ({why_not})"
    directory = decision_dir(model, reference)
    verdict = _cached(directory)
    if verdict is None and model.runtime.near_exact_check == "background":
        served = Upgradable(reference)
        check = threading.Thread(
            target=_check_beside,
            args=(model, served, reference, directory, reason),
            name=f"near-exact-{model.served_name}",
            daemon=True,
        )
        check.start()
        return served, "float32 while the near-exact check runs (--near-exact-check background)"
    return _decide(model, reference, directory, verdict)


def _decide(
    model: ResolvedModel,
    reference: Backend,
    directory: Any,
    verdict: Verdict | None,
    *,
    close_reference: bool = True,
) -> tuple[Backend, str]:
    """The near-exact decision, from the cached ``verdict`` or checked now (and cached);
    ``close_reference`` False: a candidate that passes leaves the reference open (beside
    serving, the ``Upgradable`` closes it after its last batch)."""
    unit = cpu.native_bf16()
    name, dtype = CANDIDATE
    source = "cached decision" if verdict is not None else "checked now"
    candidate: Backend | None = None
    if verdict is None or verdict.passed:
        try:
            candidate = load_candidate(model.on_backend(name, "cpu", dtype))
            if verdict is None:
                verdict = compare(model, reference, candidate)
                _store(directory, verdict, CANDIDATE)
        except Exception as exc:  # the candidate is an optimisation: fp32 still serves
            if candidate is not None:
                candidate.close()
            log.warning("model %s: %s %s failed (%s)", model.served_name, name, dtype, exc)
            return reference, f"float32 ({name} {dtype} failed: {type(exc).__name__}: {exc})"
    assert verdict is not None
    probe = f"{verdict.words()} on {verdict.inputs} probe inputs, {source}"
    if verdict.passed and candidate is not None:
        if close_reference:
            reference.close()
        return candidate, f"near-exact {name} {dtype} (this CPU has {unit}; {probe})"
    if candidate is not None:
        candidate.close()
    return reference, f"float32 kept ({name} {dtype} on {unit}: {probe})"


def _check_beside(
    model: ResolvedModel, served: Upgradable, reference: Backend, directory: Any, reason: str
) -> None:
    """The check, on its own thread at the forward priority, while ``served`` serves the
    reference; the candidate is swapped in where it passes."""
    cpu.lower_thread_priority(model.runtime.forward_nice)
    try:
        chosen, words = _decide(model, reference, directory, None, close_reference=False)
        if chosen is reference:
            log.info("model %s: auto keeps %s", model.served_name, words)
            return
        details = {**chosen.info.details, "chosen": f"auto: {reason}; {words}"}
        chosen.info = replace(chosen.info, details=details)
        if served.upgrade(chosen):
            log.info("model %s: auto serves %s, from now on", model.served_name, words)
    except Exception:  # the check is an optimisation: float32 goes on serving
        if served.closed:  # unloaded or stopping while it ran: nothing to say
            log.debug("model %s: near-exact check ended by the close", model.served_name)
        else:
            log.warning("model %s: the near-exact check failed", model.served_name, exc_info=True)
    finally:
        served.settled()
