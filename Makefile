# Two set-up commands, each makes its own environment:  `make demo` (the main job)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TENSORRT_STUBS := 10.13.0.35.1
SPECPACK_CACHE ?= $(HOME)/.cache/specpack
DEMO_PACK ?= $(SPECPACK_CACHE)/packs/qwen2.5-coder-0.5b-1.5b
DEMO_PROMPT ?= def quicksort(arr):\n    """Sort a list of numbers in ascending order."""\n

# pytest-xdist workers, each on a core of its own (tests/conftest.py); `make test WORKERS=0` runs in one process;
# PYTEST_ARGS: more pytest options (e.g. "--durations=30", or "-k NAME")
WORKERS ?= auto
PYTEST_ARGS ?=
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadscope $(PYTEST_ARGS)

.PHONY: install test test-slow test-all lint demo pack bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps tensorrt-stubs==$(TENSORRT_STUBS)  # type stubs only (docs/tensorrt.md)
	touch $@

# everything but the `slow` set (docs/testing.md says what is in it and why); test-all: everything
test: install
	$(PYTEST) -m "not slow"

test-slow: install
	$(PYTEST) -m slow

test-all: install
	$(PYTEST)

lint: install
	$(VENV)/bin/ruff check specpack tests bench tools
	$(VENV)/bin/lint-imports  # the layering (docs/architecture.md, "Layers, enforced")
	$(PY) tools/tensorrt_stubs.py
	$(VENV)/bin/mypy

# Fetch the real Qwen2.5-Coder pair (GGUF, ~1.6 GB), export it (~5 min, ~11 GB peak), generate on the CPU.
# --dequantize: the fp32 pack the README's and bench/README's first numbers were measured on (a .gguf source
# otherwise keeps its own quantized blocks: README, "Quantized packs").
pack: install
	test -f $(DEMO_PACK)/manifest.json || $(VENV)/bin/spec-export \
	  --draft "$$($(VENV)/bin/specpack fetch qwen2.5-coder-0.5b-instruct-q4_k_m)" \
	  --target "$$($(VENV)/bin/specpack fetch qwen2.5-coder-1.5b-instruct-q4_k_m)" \
	  -o $(DEMO_PACK) --k 4 --max-len 1024 --dequantize

demo: pack
	$(VENV)/bin/specpack generate $(DEMO_PACK) --prompt "$$(printf '$(DEMO_PROMPT)')" --max-new-tokens 96 --k 4

# The committed CPU benchmark (bench/README.md), 45 minutes measured on 2 cores (shared).
bench: pack
	SPECPACK=$(VENV)/bin/specpack bash bench/run_cpu.sh $(DEMO_PACK)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .typing
