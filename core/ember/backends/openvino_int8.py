"""The fast tier's graph: the onnx backend's fp32 graph quantised to int8 by NNCF for
OpenVINO (``--dtype int8`` on a CPU with ``ember[openvino]``).

Static post-training quantisation (NNCF's transformer preset: int8 weights per channel,
int8 activations with scales taken once on a fixed calibration set) runs the matmuls on
the CPU's int8 units (VNNI, AMX-INT8) and everything else at bf16 where the CPU has it
(``openvino_backend``). One exception, the selection rule: matmuls fed by the FFN's
activation (GELU) keep their float weights. Measured on all-MiniLM-L6-v2 over the whole
2,048-sentence anchor corpus (benchmarks/corpus.py) against sentence-transformers fp32,
on a busy 2-core Zen 4: every matmul int8, worst cosine 0.955 (0.954 with min-max ranges),
so a per-tensor static scale cannot hold the GELU output's few huge values; those six
matmuls kept in float, worst 0.992, mean 0.998.

Built on first use (a child process: NNCF and its statistics pass stay out of the
server) and cached under ``--cache-dir``/openvino-int8, keyed by the model's files, the
calibration set and the library versions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import ember.backends.artifacts as artifacts
import ember.backends.isolated as isolated
from ember.errors import MissingDependency
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

MODEL_FILE = "model.xml"
SCHEME = "nncf-ptq-transformer-mixed,float-ffn-out,calib-probe64-b8"
# Activations whose output range a per-tensor static int8 scale cannot hold (above).
_KEEP_FLOAT_AFTER = {"Gelu", "Erf", "Relu", "Swish", "HSwish", "Mish"}
_CALIBRATION_BATCH = 8


def float_matmuls(ov_model: Any) -> list[str]:
    """Matmuls fed (through reshapes) by an FFN activation: they stay float."""
    through = {"Reshape", "Transpose", "Convert", "Squeeze", "Unsqueeze"}
    keep = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        src = op.input_value(0).get_node()
        while src.get_type_name() in through:
            src = src.input_value(0).get_node()
        if src.get_type_name() in _KEEP_FLOAT_AFTER:
            keep.append(op.get_friendly_name())
    return keep


def calibration_feeds(model: ResolvedModel, names: set[str]) -> list[dict[str, Any]]:
    """The fixed calibration set: the near-exact probe's 64 mixed-length texts, tokenised
    with the model's own processor, in batches of ``_CALIBRATION_BATCH``."""
    import numpy as np

    from ember.backends.probe_set import probe_texts
    from ember.processors.text import TextTokenizer, collate

    tokenizer = TextTokenizer(model)
    tokens = tokenizer.encode(probe_texts())
    feeds = []
    for start in range(0, len(tokens), _CALIBRATION_BATCH):
        batch = collate(tokens[start : start + _CALIBRATION_BATCH], tokenizer.pad_id)
        arrays = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "token_type_ids": batch.token_type_ids,
        }
        feeds.append({k: v.astype(np.int64) for k, v in arrays.items() if k in names})
    return feeds


def _build(model: ResolvedModel, source: Path, out_dir: Path) -> dict[str, Any]:
    """Quantise ``source`` (an fp32 ONNX graph) into ``out_dir``/model.xml."""
    import nncf
    import openvino

    ov_model = openvino.Core().read_model(str(source))
    names = {i.get_any_name() for i in ov_model.inputs}
    keep = float_matmuls(ov_model)
    quantised = nncf.quantize(
        ov_model,
        nncf.Dataset(calibration_feeds(model, names)),
        model_type=nncf.ModelType.TRANSFORMER,
        preset=nncf.QuantizationPreset.MIXED,
        subset_size=64,
        ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
    )
    openvino.save_model(quantised, str(out_dir / MODEL_FILE))
    return {"float_matmuls": len(keep)}


def prepare(model: ResolvedModel, source: Path) -> Path:
    """The int8 IR for ``model`` built from its fp32 ONNX graph ``source`` (cached)."""
    try:
        import nncf  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "--dtype int8 on openvino quantises with nncf: pip install 'ember[openvino]'"
        ) from exc
    options = {
        "scheme": SCHEME,
        "source": str(source),
        "versions": artifacts.package_versions(("openvino", "nncf", "onnxruntime")),
    }
    target = artifacts.artifact_dir(model, "openvino-int8", options)
    if artifacts.read_manifest(target) is not None and (target / MODEL_FILE).is_file():
        return target / MODEL_FILE
    log.info(
        "quantising %s to int8 for OpenVINO in %s (first load only)", model.served_name, target
    )
    with artifacts.staging(target) as tmp:
        built = isolated.run(_build, model, source, tmp)
        artifacts.write_manifest(tmp, {"backend": "openvino-int8", "scheme": SCHEME, **built})
    return target / MODEL_FILE
