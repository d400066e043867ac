# Ember's general image: `ember serve` on port 7997, as TEI's and Infinity's images run.
#
#   docker build -t ember .                                   # CPU (torch CPU wheel, onnxruntime)
#   docker build --build-arg DEVICE=cuda --build-arg TORCH_WHEEL=cuda -t ember:cuda .   # CUDA
#   docker build --build-arg MODEL_ID=BAAI/bge-small-en-v1.5 -t ember:bge-small .   # baked model
#   docker run -p 7997:7997 ember                             # the packaged all-MiniLM-L6-v2, offline
#   docker run -p 7997:7997 -v ember-data:/data ember --model-id BAAI/bge-small-en-v1.5
#
# Arguments are `ember serve` flags (`docker run ember --help` lists them) and every
# EMBER_* variable works (`-e EMBER_API_KEY=...`). The process runs as uid 10001 (user
# `ember`, gid 10001); the Hugging Face cache (HF_HOME=/data/hf) and converted artifacts
# (EMBER_CACHE_DIR=/data/ember) live in the /data volume, so `--read-only` works with a
# tmpfs on /tmp (`--read-only --tmpfs /tmp`). SIGTERM drains: the listener closes, requests
# in flight finish (up to 10 s), the process exits 0; give `docker stop` more than that
# (`--stop-timeout 30`, Kubernetes' terminationGracePeriodSeconds).
#
# Base image: Debian 12 slim, pinned by digest; Python is Debian's 3.11. The suite builds it
# on a Debian 12 minbase made locally (mmdebstrap), passed as BASE_IMAGE: nothing but the
# base's provenance differs. The CUDA variant keeps the same base: PyPI's torch CUDA wheel
# and onnxruntime-gpu carry their CUDA libraries (hosts need an NVIDIA driver for CUDA 13).
ARG BASE_IMAGE=debian:12-slim@sha256:88200866dfff7ea7f5cbcb6ec7c8a701889efe6fe859fe64d6990e4b07ea4171
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Debian's Python and its venv; apt versions are not pinned because Debian removes
# superseded point releases from its archive (the digest above fixes the base itself).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV" \
    && groupadd --gid 10001 ember \
    && useradd --uid 10001 --gid 10001 --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin ember \
    && mkdir -p /data \
    && chown 10001:10001 /data

WORKDIR /opt/ember
COPY platforms/constraints.txt /tmp/constraints-all.txt
RUN awk '/^# [a-z0-9-]+$/ {on = ($2 == "image"); next} on' /tmp/constraints-all.txt \
        > /tmp/constraints.txt \
    && grep -q '^torch==' /tmp/constraints.txt \
    && grep -vE '^(torch|onnxruntime|onnxruntime-gpu)==' /tmp/constraints.txt > /tmp/rest.txt

# torch first: the CPU wheel (PyTorch's CPU index, TORCH_CPU_INDEX; empty: pip's own
# configuration finds it) or PyPI's CUDA wheel (it carries its CUDA libraries); then every
# other pin. DEVICE is declared only after these, so the CPU and CUDA images share these
# layers when they share the torch wheel (the suite builds DEVICE=cuda on the CPU wheel,
# where no GPU and no CUDA wheel can be had).
ARG TORCH_WHEEL=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN version="$(sed -n 's/^torch==//p' /tmp/constraints.txt)" \
    && case "$TORCH_WHEEL" in \
        cpu) pip install -c /tmp/constraints.txt \
                ${TORCH_CPU_INDEX:+--extra-index-url "$TORCH_CPU_INDEX"} "torch==${version}+cpu" ;; \
        cuda) pip install -c /tmp/constraints.txt "torch==${version}" ;; \
        *) echo "TORCH_WHEEL must be cpu or cuda, got ${TORCH_WHEEL}" >&2; exit 1 ;; \
    esac \
    && pip install -c /tmp/constraints.txt -r /tmp/rest.txt

# onnxruntime for DEVICE=cpu, onnxruntime-gpu (CUDA and CPU providers) for DEVICE=cuda.
ARG DEVICE=cpu
RUN case "$DEVICE" in \
        cpu) runtime=onnxruntime ;; \
        cuda) runtime=onnxruntime-gpu ;; \
        *) echo "DEVICE must be cpu or cuda, got ${DEVICE}" >&2; exit 1 ;; \
    esac \
    && pip install -c /tmp/constraints.txt "$runtime" \
    && pip check \
    && if [ "$DEVICE" = cuda ] && [ "$TORCH_WHEEL" = cpu ]; then \
        echo "warning: DEVICE=cuda on TORCH_WHEEL=cpu: no CUDA libraries unless the base has them" >&2; fi

# Ember last, without dependencies (all installed above): editing core/ rebuilds from here.
COPY pyproject.toml README.md LICENSE ./
COPY core core
RUN pip install --no-deps -c /tmp/constraints.txt . && ember --version

ENV HF_HOME=/data/hf \
    EMBER_CACHE_DIR=/data/ember \
    XDG_CACHE_HOME=/data/cache \
    HOME=/data

# Models and their artifacts, built now so the container starts offline without
# converting: MODEL_ID empty (the default) preloads the packaged all-MiniLM-L6-v2 and its
# ONNX graph; `--build-arg MODEL_ID="BAAI/bge-small-en-v1.5;BAAI/bge-reranker-base"` downloads
# those too (gated models: `--secret id=HF_TOKEN,env=HF_TOKEN`, never stored in a layer).
# They are written under /data as uid 10001: a fresh volume on /data starts with them
# (Docker and Podman copy an image's contents into a new volume); a volume that already
# holds files, or a Kubernetes emptyDir, hides them (docs/deploy/kubernetes.md).
ARG MODEL_ID=""
ARG MODEL_REVISION=""
RUN --mount=type=secret,id=HF_TOKEN,required=false \
    if [ -f /run/secrets/HF_TOKEN ]; then HF_TOKEN="$(cat /run/secrets/HF_TOKEN)"; export HF_TOKEN; fi \
    && HF_HUB_OFFLINE="$([ -z "$MODEL_ID" ] && echo 1 || echo 0)" \
        EMBER_MODEL_ID="$MODEL_ID" EMBER_REVISION="$MODEL_REVISION" EMBER_LOG_LEVEL=warning \
        ember serve --preload-only \
    && chown -R 10001:10001 /data \
    && rm -rf /tmp/*
ENV EMBER_MODEL_ID=${MODEL_ID} \
    EMBER_REVISION=${MODEL_REVISION}

USER 10001:10001
VOLUME ["/data"]
EXPOSE 7997
STOPSIGNAL SIGTERM
# /ready answers 200 once every model is loaded and warm (/health only says the process
# is up). EMBER_PORT moves it with the server.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('EMBER_PORT', '7997'), timeout=4)"]
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
ENTRYPOINT ["ember", "serve"]
