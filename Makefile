# The README's two commands: `make serve` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# CPU PyTorch first, pinned: a plain `torch` requirement would pull a multi-GB CUDA build.
# On another machine override, e.g. TORCH_SPEC="torch==2.13.0 --index-url <your CPU index>".
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= torch,onnx,openvino,ct2,media,default-model,modal,bentoml,runpod,sagemaker,jobs,ray,bench,otel,test
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

# The image tests (tests/platforms/test_images.py) wait mostly on pip downloads and the disk,
# the rest of the suite on the CPU: they run beside it, in their own pytest, and either one
# failing fails `make test` (the images' report follows the suite's).
IMAGES_LOG ?= $(VENV)/images-tests.log

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=10 \
	    tests/platforms/test_images.py > $(IMAGES_LOG) 2>&1 & images=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=25 \
	    --ignore=tests/platforms/test_images.py; suite=$$?; \
	wait $$images; built=$$?; \
	echo "== tests/platforms/test_images.py (beside the suite)"; cat $(IMAGES_LOG); \
	test $$suite -eq 0 && test $$built -eq 0

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV)
