# Two commands do everything on a fresh machine with only Python installed:
#   make demo   # creates .venv, installs, runs the main job (bebop demo)
#   make test   # same set-up, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean bench

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

# torch: keep one that is already importable (a CUDA build, say); otherwise the local CPU build.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
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

clean:
	rm -rf $(VENV) build *.egg-info
