#!/usr/bin/env bash
# The GPU benchmark as one prepared run (under 8 minutes on an H100/H200): Ember's torch
# fp16/bf16 paths and the ONNX Runtime CUDA provider on a bge-base-size encoder, at 64- and
# 512-token mixes, as tokens/s and fractions of a measured bf16 GEMM and the data-sheet peak.
# Needs a CUDA torch and Ember's core requirements in the Python it runs (PYTHON, default
# python3); the ONNX row needs onnxruntime-gpu, the padding-free attention row flash-attn.
# With TensorRT present, ORT builds an engine per batch shape and the onnx row runs slow.
# Rows print as measured (a later failure keeps them); arguments go to
# benchmarks/gpu_bench.py (e.g. --json out.json, rewritten after every row).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
PYTHONPATH=core:. timeout 480 "$PYTHON" benchmarks/gpu_bench.py "$@"
