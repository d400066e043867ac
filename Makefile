# The README's two commands: `make serve` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU PyTorch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
# On another machine override, e.g. TORCH_SPEC="torch==2.13.0 --index-url <your CPU index>".
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= torch,onnx,openvino,ct2,media,default-model,modal,bentoml,runpod,sagemaker,jobs,bench,otel,test
PORT ?= 7997
STAMP  := $(VENV)/.installed

.PHONY: serve test lint install clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	HF_HUB_OFFLINE=$${HF_HUB_OFFLINE:-0} $(BIN)/ember serve --port $(PORT)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV)
