# One-command setup + run. `make bench` runs the main job on the embedded
# engine; `make test` runs the whole test suite. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aibrix-eic-installed
# torch==2.13.0 resolves to the CPU wheel on this project's machines; a bare
# `torch` requirement would pull a multi-GB CUDA build. Skipped if the venv
# already has a torch.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test bench check clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --disable-pip-version-check -q "$(TORCH_PIN)"
	$(PY) -m pip install --disable-pip-version-check -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/aibrix-eic bench $(BENCH_ARGS)

check: $(STAMP)
	$(VENV)/bin/aibrix-eic check $(CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
